"""Never two nodes of a pool down at once, decided from the pods' own records: a
`kubectl get pods --watch --output-watch-events -o json` stream captured while a rollout
ran. Usage:

    pod_downtime.py WATCH_JSON SINCE

A pod name is down from its pod's deletion request (deletionTimestamp minus
deletionGracePeriodSeconds), from a Ready=False transition, or from a replacement's
creation, until a Ready=True transition of that name (the kubelet's lastTransitionTime of
the Ready condition, not when this test happened to look). Prints each name's down
intervals and the most names down at once from SINCE (Unix seconds: when the rollout
began; earlier records only set each name's state); exits 1 if that is more than one.
"""

import json
import sys
from datetime import datetime, timedelta, timezone


def when(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def objects(text: str):
    decoder = json.JSONDecoder()
    at = 0
    while True:
        while at < len(text) and text[at].isspace():
            at += 1
        if at >= len(text):
            return
        item, at = decoder.raw_decode(text, at)
        yield item.get("object", item)


def main() -> int:
    # (name, time, "created" | "up" | "down"); one entry per distinct record, so a record
    # seen in several watch events counts once.
    since = datetime.fromtimestamp(int(sys.argv[2]), timezone.utc)
    events: dict[tuple[str, datetime, str], None] = {}
    for pod in objects(open(sys.argv[1]).read()):
        meta = pod.get("metadata", {})
        name = meta.get("name")
        if not name:
            continue
        events[(name, when(meta["creationTimestamp"]), "created")] = None
        if meta.get("deletionTimestamp"):
            grace = meta.get("deletionGracePeriodSeconds") or 0
            requested = when(meta["deletionTimestamp"]) - timedelta(seconds=grace)
            events[(name, requested, "down")] = None
        for condition in pod.get("status", {}).get("conditions", []):
            if condition.get("type") == "Ready" and condition.get("lastTransitionTime"):
                state = "up" if condition["status"] == "True" else "down"
                events[(name, when(condition["lastTransitionTime"]), state)] = None
    # In time order. The records have 1 s resolution, so at one instant: a pod's creation
    # comes first (it precedes its own Ready, which can fall in the same second), then a
    # name coming up, then another going down (the operator waits for Ready before the
    # next step).
    rank = {"created": 0, "up": 1, "down": 2}
    ordered = sorted(events, key=lambda e: (e[1], rank[e[2]]))
    state: dict[str, str] = {}
    began: dict[str, datetime] = {}
    intervals: dict[str, list[tuple[datetime | None, datetime]]] = {}
    most, worst = 0, ""
    for name, at, change in ordered:
        change = "down" if change == "created" else change
        if state.get(name, "up") != change:
            state[name] = change
            if change == "down":
                began[name] = at
            else:
                intervals.setdefault(name, []).append((began.get(name), at))
        down = sorted(n for n, s in state.items() if s == "down")
        if at >= since and len(down) > most:
            most, worst = len(down), f"{at:%H:%M:%S}: {', '.join(down)}"
    for name in sorted(set(intervals) | set(state)):
        shown = [f"{start:%H:%M:%S}-{end:%H:%M:%S}" if start else f"…-{end:%H:%M:%S}"
                 for start, end in intervals.get(name, []) if end >= since]
        print(f"{name} down {' '.join(shown) or 'never'}")
    for name in sorted(n for n, s in state.items() if s == "down"):
        print(f"{name} down since {began[name]:%H:%M:%S} (not Ready at the end)")
    print(f"most nodes down at once: {most}" + (f" ({worst})" if worst else ""))
    return 1 if most > 1 else 0


if __name__ == "__main__":
    sys.exit(main())
