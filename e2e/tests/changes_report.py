"""The figures of e2e/tests/changes: one row per scenario from the flightcache-load and
pyarrow summaries, the convergence times and the miss budgets, and the targets checked.

    changes_report.py LOAD_JSON PYARROW_JSON CONVERGE_FILE STAKES_FILE

STAKES_FILE lines: `SCENARIO stake ENTRIES RATE` (the entries whose holder the scenario
touches, read from the nodes just before it, and the share of them that may miss) and
`SCENARIO hung SECONDS` (how long a frozen process was stopped).
Exit 1 (with BROKEN lines) when a target is missed. Every failed call is printed by class.

Targets:
- no corrupt read, ever;
- a planned change (live config, resize, restart with handoff, resharding, replicas), a
  pod deleted by hand and a pod force-deleted (both get SIGTERM: the node hands its
  entries off and closes its connections with GOAWAY) fail no call: no allowance;
- a crashed process (SIGKILL) may fail only the calls in flight on the clients' own
  connections to it: each client worker runs one call at a time, so one per worker when
  it dies and one more on the dead connection before the client library reconnects (the
  pyarrow loop pauses 1 s after a failed call, as a cache-aside client computes the
  result instead; gRPC-core fails every call at once while it backs off reconnecting):
  CRASH_FAILED_CALLS = 2 x (8 flightcache-load workers + 1 pyarrow loop);
- a hung process (SIGSTOP) cannot answer the clients connected to it: each such
  connection fails one call per 5 s client deadline while it is hung:
  (8 + 1) x (hung seconds // 5 + 1). Calls that reach it through a peer fail over;
- misses (flightcache-load, 20,000 keys read uniformly): at most RATE x ENTRIES per
  scenario — 0.5% of the keys whose holder a planned change or SIGTERM touches (keys
  written during a switch and read before their copy lands; a restart with handoff moves
  every key twice, out and back), 100% of a crashed node's entries with one copy (they
  are gone, each misses once), 0.5% of them with two copies; a frozen node's with one
  copy 100% (unreachable while it hangs, each misses once) + 0.5% (its return is a ring
  change), with two copies 0.5%, and for a freeze one more per failed call allowed (a
  refill the hung process took and never answered leaves its key unfilled). Losing one
  node's share (a third of the keys) breaks every 0.5% budget by two orders of magnitude;
- every bound above is enforced: a scenario over it fails the test (BROKEN lines);
- the hit ratio stays >= 95% of the steady state in a planned change and >= 60% in a
  fault, for the Rust and the pyarrow client alike.
"""

import json
import sys

LIVE = ["ttl", "eviction", "max-entries", "memory-up", "memory-down"]
# Run with one copy of each key, then again with two (NAME/r2).
DISRUPTIONS = ["node-crash", "restart", "scale-out", "scale-in", "pod-delete", "node-kill",
               "node-frozen"]
SCENARIOS = (["baseline"] + LIVE + DISRUPTIONS + ["replicas-up"]
             + [f"{name}/r2" for name in DISRUPTIONS])
WORKERS = 8 + 1
CLIENT_DEADLINE_S = 5
CRASH_FAILED_CALLS = 2 * WORKERS
# Not planned by the operator: a pod deleted by hand, a crash, a hung process.
UNPLANNED = {"pod-delete", "node-kill", "node-crash", "node-frozen"}


def read_stakes(path: str) -> tuple[dict, dict]:
    stakes, hung = {}, {}
    for line in open(path):
        parts = line.split()
        if len(parts) == 4 and parts[1] == "stake":
            stakes[parts[0]] = (int(parts[2]), float(parts[3]))
        elif len(parts) == 3 and parts[1] == "hung":
            hung[parts[0]] = int(parts[2])
    return stakes, hung


def main() -> int:
    rust = json.load(open(sys.argv[1]))
    py = json.load(open(sys.argv[2]))
    converge = dict(line.split() for line in open(sys.argv[3]) if line.strip())
    stakes, hung = read_stakes(sys.argv[4])
    by_phase = {p["phase"]: p for p in rust["phases"]}
    steady = (by_phase.get("baseline") or {}).get("hit_ratio") or 0.0
    py_base = py["phases"].get("baseline", {})
    py_steady = py_base.get("hits", 0) / py_base["gets"] if py_base.get("gets") else 0.0
    print(f"{'scenario':<15} {'converge s':>10} {'gets':>8} {'hit ratio':>9} {'misses':>6} "
          f"{'budget':>6} {'of entries':>10} {'failed':>6} {'p99 ms':>7} | {'py gets':>7} "
          f"{'py hit':>7} {'py failed':>9}")
    bad = []
    for name in SCENARIOS:
        kind = name.split("/")[0]
        p = by_phase.get(name)
        q = py["phases"].get(name, {"gets": 0, "hits": 0, "misses": 0, "errors": 0, "corrupt": 0})
        if p is None or p["gets"] == 0 or q["gets"] == 0:
            bad.append(f"{name}: no traffic")
            continue
        hit = p["hit_ratio"] or 0.0
        py_hit = q["hits"] / q["gets"]
        entries, rate = stakes.get(name, (0, 0.0))
        failed = p["errors"] + q["errors"]
        if kind == "node-crash":
            allowed, why = CRASH_FAILED_CALLS, "in flight to the crashed process"
        elif kind == "node-frozen":
            allowed = WORKERS * (hung.get(name, 0) // CLIENT_DEADLINE_S + 1)
            why = f"on the clients' connections to the process hung {hung.get(name, 0)} s"
        else:
            allowed, why = 0, "allowed"
        budget = int(entries * rate) if name in stakes else None
        if budget is not None and kind == "node-frozen":
            budget += allowed
        print(f"{name:<15} {converge.get(name, '-'):>10} {p['gets']:>8} {hit:>9.4f} {p['misses']:>6} "
              f"{'-' if budget is None else budget:>6} {entries if name in stakes else '-':>10} "
              f"{p['errors']:>6} {p['p99_ms'] or 0:>7.2f} | {q['gets']:>7} {py_hit:>7.4f} {q['errors']:>9}")
        if q["corrupt"]:
            bad.append(f"{name}: {q['corrupt']} corrupt pyarrow reads")
        if budget is not None and p["misses"] > budget:
            bad.append(f"{name}: {p['misses']} misses, over its budget of {budget} "
                       f"({rate:.1%} of the {entries} entries it touches)")
        floor = 0.60 if kind in UNPLANNED else 0.95
        if hit < floor * steady:
            bad.append(f"{name}: hit ratio {hit:.4f} is under {floor:.0%} of the steady {steady:.4f}")
        if py_hit < floor * py_steady:
            bad.append(f"{name}: pyarrow hit ratio {py_hit:.4f} is under {floor:.0%} of its steady {py_steady:.4f}")
        if failed > allowed:
            bad.append(f"{name}: {failed} failed calls (flightcache-load {p['errors_by_code']}, "
                       f"pyarrow {q['errors']}), more than the {allowed} {why}")
    t = rust["totals"]
    print(f"{'total':<15} {'':>10} {t['gets']:>8} {t['hit_ratio'] or 0:>9.4f} {t['misses']:>6} "
          f"{'':>6} {'':>10} {t['errors']:>6} {t['p99_ms'] or 0:>7.2f}")
    if t["corrupt"]:
        bad.append(f"{t['corrupt']} corrupt reads: {rust['corrupt_samples']}")
    for sample in rust.get("error_samples", []) + py.get("error_samples", []):
        print("error sample:", sample)
    for line in bad:
        print("BROKEN:", line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
