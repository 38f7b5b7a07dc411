"""Never two nodes of a pool down at once, decided from the pods' own records: a
`kubectl get pods --watch --output-watch-events -o json` stream captured while a rollout
ran. Usage:

    pod_downtime.py WATCH_JSON SINCE

A pod (by uid) is down from its creation, from a Ready=False transition or from its
deletion request (deletionTimestamp minus deletionGracePeriodSeconds, for good), and up
from a Ready=True transition (the kubelet's lastTransitionTime of the Ready condition, not
when this test happened to look). A pod name is down while none of its pods is up. Prints each name's down
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
    # (time, name, uid, "created" | "up" | "down" | "deleted"), from the records in the
    # order the watch delivered them. States are kept per pod (uid), and a pod's Ready
    # transitions are taken in that order: the records' times have 1 s resolution, so a
    # new pod whose first record says Ready=False and whose next says Ready=True can carry
    # the same second twice; that pod was down from its creation and is up, not the other
    # way round. A replaced pod's last records (its Ready=False as its containers stop) do
    # not take its name down again once its successor is up.
    since = datetime.fromtimestamp(int(sys.argv[2]), timezone.utc)
    events: dict[tuple[datetime, str, str, str], None] = {}
    ready: dict[str, bool] = {}
    for pod in objects(open(sys.argv[1]).read()):
        meta = pod.get("metadata", {})
        name, uid = meta.get("name"), meta.get("uid", "")
        if not name:
            continue
        events[(when(meta["creationTimestamp"]), name, uid, "created")] = None
        if meta.get("deletionTimestamp"):
            grace = meta.get("deletionGracePeriodSeconds") or 0
            requested = when(meta["deletionTimestamp"]) - timedelta(seconds=grace)
            events[(requested, name, uid, "deleted")] = None
        for condition in pod.get("status", {}).get("conditions", []):
            if condition.get("type") != "Ready" or not condition.get("lastTransitionTime"):
                continue
            is_ready = condition["status"] == "True"
            if is_ready != ready.get(uid, False):
                ready[uid] = is_ready
                events[(when(condition["lastTransitionTime"]), name, uid, "up" if is_ready else "down")] = None
    # In time order; at one instant a pod's creation first, then pods coming up, then
    # pods going down (the operator waits for Ready before the next step), then deletions.
    rank = {"created": 0, "up": 1, "down": 2, "deleted": 3}
    ordered = sorted(events, key=lambda e: (e[0], rank[e[3]]))
    pod_up: dict[str, bool] = {}
    deleted: set[str] = set()
    uids: dict[str, set[str]] = {}
    name_down: dict[str, bool] = {}
    began: dict[str, datetime] = {}
    intervals: dict[str, list[tuple[datetime | None, datetime]]] = {}
    most, worst = 0, ""
    for at, name, uid, change in ordered:
        uids.setdefault(name, set()).add(uid)
        if change == "deleted":
            deleted.add(uid)
        pod_up[uid] = change == "up" and uid not in deleted
        down = not any(pod_up.get(u, False) for u in uids[name])
        if name_down.get(name, False) != down:
            name_down[name] = down
            if down:
                began[name] = at
            else:
                intervals.setdefault(name, []).append((began.get(name), at))
        now_down = sorted(n for n, d in name_down.items() if d)
        if at >= since and len(now_down) > most:
            most, worst = len(now_down), f"{at:%H:%M:%S}: {', '.join(now_down)}"
    for name in sorted(set(intervals) | set(name_down)):
        shown = [f"{start:%H:%M:%S}-{end:%H:%M:%S}" if start else f"…-{end:%H:%M:%S}"
                 for start, end in intervals.get(name, []) if end >= since]
        print(f"{name} down {' '.join(shown) or 'never'}")
    for name in sorted(n for n, d in name_down.items() if d):
        print(f"{name} down since {began[name]:%H:%M:%S} (not Ready at the end)")
    print(f"most nodes down at once: {most}" + (f" ({worst})" if worst else ""))
    return 1 if most > 1 else 0


if __name__ == "__main__":
    sys.exit(main())
