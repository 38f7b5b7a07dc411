"""The figures of e2e/tests/changes: one row per scenario from the flightcache-load and
pyarrow summaries and the convergence times, and the targets checked on them.

    changes_report.py LOAD_JSON PYARROW_JSON CONVERGE_FILE

Exit 1 (with BROKEN lines) when a target is missed.

The target is no failed call in a planned change. CI allows one per 50,000 gets of a
scenario (none in a shorter one): a run on 2026-11-22 saw 2 of 213,506 gets fail while
nodes restarted (`INTERNAL: h2 protocol error`, a 5 s client deadline), not yet explained
(docs/benchmarks.md). Every failed call is printed, so the table shows the truth either way.
"""

import json
import sys

SCENARIOS = ["baseline", "ttl", "eviction", "max-entries", "memory-up", "memory-down",
             "restart", "scale-out", "scale-in", "pod-delete", "node-kill", "node-frozen"]
# At most one failed call per this many gets of a planned scenario (see the module doc).
FAILED_CALL_ALLOWANCE = 50_000
# Not planned by the operator: a pod deleted by hand, a crash, a hung process.
UNPLANNED = {"pod-delete", "node-kill", "node-frozen"}


def main() -> int:
    rust = json.load(open(sys.argv[1]))
    py = json.load(open(sys.argv[2]))
    converge = dict(line.split() for line in open(sys.argv[3]) if line.strip())
    by_phase = {p["phase"]: p for p in rust["phases"]}
    steady = (by_phase.get("baseline") or {}).get("hit_ratio") or 0.0
    py_base = py["phases"].get("baseline", {})
    py_steady = py_base.get("hits", 0) / py_base["gets"] if py_base.get("gets") else 0.0
    print(f"{'scenario':<12} {'converge s':>10} {'gets':>8} {'hit ratio':>9} {'vs steady':>9} "
          f"{'misses':>6} {'failed':>6} {'p99 ms':>7} | {'py gets':>7} {'py hit':>7} {'py failed':>9}")
    bad = []
    for name in SCENARIOS:
        p = by_phase.get(name)
        q = py["phases"].get(name, {"gets": 0, "hits": 0, "misses": 0, "errors": 0, "corrupt": 0})
        if p is None or p["gets"] == 0 or q["gets"] == 0:
            bad.append(f"{name}: no traffic")
            continue
        hit = p["hit_ratio"] or 0.0
        rel = hit / steady if steady else 0.0
        py_hit = q["hits"] / q["gets"]
        print(f"{name:<12} {converge.get(name, '-'):>10} {p['gets']:>8} {hit:>9.4f} {rel:>9.4f} "
              f"{p['misses']:>6} {p['errors']:>6} {p['p99_ms'] or 0:>7.2f} | "
              f"{q['gets']:>7} {py_hit:>7.4f} {q['errors']:>9}")
        if q["corrupt"]:
            bad.append(f"{name}: {q['corrupt']} corrupt pyarrow reads")
        # The pyarrow client's hit ratio is held to the same bar as the Rust client's.
        floor = 0.60 if name in UNPLANNED else 0.95
        if py_hit < floor * py_steady:
            bad.append(f"{name}: pyarrow hit ratio {py_hit:.4f} is under {floor:.0%} of its steady {py_steady:.4f}")
        if name in UNPLANNED:
            # At most the node's share (a third of the keys) may miss: a killed node's
            # entries are gone until refilled.
            if hit < 0.60 * steady:
                bad.append(f"{name}: hit ratio {hit:.4f} fell below 60% of steady state")
            continue
        if rel < 0.95:
            bad.append(f"{name}: hit ratio {hit:.4f} is under 95% of the steady {steady:.4f}")
        allowed = p["gets"] // FAILED_CALL_ALLOWANCE
        if p["errors"] > allowed or q["errors"] > q["gets"] // FAILED_CALL_ALLOWANCE:
            bad.append(f"{name}: failed calls: flightcache-load {p['errors']} "
                       f"{p['errors_by_code']}, pyarrow {q['errors']}")
    t = rust["totals"]
    print(f"{'total':<12} {'':>10} {t['gets']:>8} {t['hit_ratio'] or 0:>9.4f} {'':>9} "
          f"{t['misses']:>6} {t['errors']:>6} {t['p99_ms'] or 0:>7.2f}")
    if t["corrupt"]:
        bad.append(f"{t['corrupt']} corrupt reads: {rust['corrupt_samples']}")
    for sample in rust.get("error_samples", []) + py.get("error_samples", []):
        print("error sample:", sample)
    for line in bad:
        print("BROKEN:", line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
