"""Put levers: DoPut p50 of the large shapes for node variants (another binary, or the same
binary with other allocator settings in its environment) side by side with the pyarrow
Flight server, in interleaved rounds (docs/benchmarks.md, "Puts: the allocator levers").

    python cache-node/bench/put_levers.py NAME=BIN[:ENV=VALUE,ENV=VALUE] ...
    e.g. put_levers.py adr5=$BIN thp=$BIN:GLIBC_TUNABLES=glibc.malloc.hugetlb=1

Every node variant starts with the pods' glibc settings plus its own; ROUNDS=n (default 5)
sets the rounds. Uses the bench venv (cache-node/bench/run creates it). Every server it
starts is stopped by PID when it ends.
"""
import os, sys, time, statistics, tempfile
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import flight_bench as fb
import pyarrow.flight as flight

SHAPES = [(10_000, 8), (50_000, 2), (50_000, 8)]
variants = []
for arg in sys.argv[1:]:
    name, rest = arg.split("=", 1)
    binpath, _, envs = rest.partition(":")
    env = dict(fb.NODE_MALLOC_ENV)
    for kv in filter(None, envs.split(",")):
        k, v = kv.split("=", 1)
        env[k] = v
    variants.append((name, binpath, env))

work = tempfile.mkdtemp()
procs = fb.Processes(work, None)
systems = {}
try:
    for name, binpath, env in variants:
        port, mport = fb.free_port(), fb.free_port()
        procs.start(name, [binpath, "--listen", f"{fb.HOST}:{port}", "--metrics-listen", f"{fb.HOST}:{mport}",
                           "--memory-budget", "512MiB", "--max-entry-size", "64MiB"], env=env)
        fb.wait_ready(procs, name, fb.NODE, port)
        systems[name] = fb.FlightSystem(fb.NODE, port)
    port = fb.free_port()
    procs.start("pyarrow", [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "pyarrow_server.py"), "--port", str(port)])
    fb.wait_ready(procs, "pyarrow", fb.PYARROW, port)
    systems["pyarrow"] = fb.FlightSystem(fb.PYARROW, port)
    tables = {s: fb.make_table(*s) for s in SHAPES}
    samples = {(n, s): [] for n in systems for s in SHAPES}
    for rnd in range(int(os.environ.get("ROUNDS", "5"))):
        for s in SHAPES:
            for n, sysm in systems.items():
                for i in range(5):
                    sysm.put(f"lever/{s[0]}x{s[1]}", tables[s])
                for i in range(40):
                    t = time.perf_counter_ns()
                    sysm.put(f"lever/{s[0]}x{s[1]}", tables[s])
                    samples[(n, s)].append(time.perf_counter_ns() - t)
    print("| shape | " + " | ".join(systems) + " |")
    for s in SHAPES:
        ref = statistics.median(samples[("pyarrow", s)])
        cells = []
        for n in systems:
            m = statistics.median(samples[(n, s)])
            cells.append(f"{m/1000:,.0f} µs ({m/ref:.2f}×)")
        print(f"| {s[0]:,}×{s[1]} ({tables[s].nbytes:,} B) | " + " | ".join(cells) + " |")
    for name, _, _ in variants:
        print(name, "rss MiB", fb.rss_bytes(procs.procs[name].pid) / 2**20)
finally:
    procs.stop_all()
