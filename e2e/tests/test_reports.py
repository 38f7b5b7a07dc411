"""Unit tests of the e2e judges: changes_report.py (the targets of e2e/tests/changes and
multi-node) and monitoring_check.py (what e2e/tests/monitoring asks Prometheus). Run by
scripts/test with the project's venv: `python -m pytest -q e2e/tests/test_reports.py`.

The report is fed summaries written here, shaped as flightcache-load and pyarrow_load.py
write them; monitoring_check.py's HTTP calls go to a small server on 127.0.0.1 that
answers as Prometheus's API does (the e2e itself asks a real Prometheus).
"""

import http.server
import json
import os
import sys
import threading

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import changes_report  # noqa: E402
import monitoring_check  # noqa: E402


# ---------------------------------------------------------------- changes_report.py


def rust_phase(name, gets=10_000, misses=0, errors=0, retried=0, hit_ratio=None, by_code=None):
    return {
        "phase": name,
        "gets": gets,
        "misses": misses,
        "errors": errors,
        "errors_by_code": by_code or ({"UNAVAILABLE": errors} if errors else {}),
        "retried": retried,
        "hit_ratio": hit_ratio if hit_ratio is not None else (gets - misses) / max(gets, 1),
        "p99_ms": 10.0,
    }


def py_phase(gets=300, misses=0, errors=0, corrupt=0, hits=None):
    return {"gets": gets, "hits": gets - misses if hits is None else hits, "misses": misses,
            "errors": errors, "corrupt": corrupt}


class Run:
    """A run of the changes e2e as files: every scenario clean unless a test changes it."""

    def __init__(self, tmp_path, scenarios=("baseline", "restart", "node-crash", "node-lost")):
        self.dir = tmp_path
        self.scenarios = list(scenarios)
        self.rust = {name: rust_phase(name) for name in scenarios}
        self.py = {name: py_phase() for name in scenarios}
        self.stakes = {"restart": (40_000, 0.005), "node-crash": (6_775, 1.0),
                       "node-lost": (6_775, 0.005)}
        self.corrupt = 0
        self.seen = {}

    def judge(self, capsys):
        rust = {
            "phases": list(self.rust.values()),
            "totals": {"gets": 1, "hit_ratio": 1.0, "misses": 0, "errors": 0, "p99_ms": 1.0,
                       "corrupt": self.corrupt},
            "corrupt_samples": ["load/7: label differs"] if self.corrupt else [],
        }
        paths = {}
        for name, text in {
            "rust.json": json.dumps(rust),
            "py.json": json.dumps({"phases": self.py}),
            "converge": "restart 70\n",
            "stakes": "".join(f"{n} stake {e} {r}\n" for n, (e, r) in self.stakes.items())
                      + "".join(f"{n} seen {c} {t}\n" for n, (c, t) in self.seen.items()),
        }.items():
            path = self.dir / name
            path.write_text(text)
            paths[name] = str(path)
        sys.argv = ["changes_report.py", paths["rust.json"], paths["py.json"], paths["converge"],
                    paths["stakes"], ",".join(self.scenarios)]
        code = changes_report.main()
        out = capsys.readouterr().out
        broken = [line for line in out.splitlines() if line.startswith("BROKEN:")]
        gaps = [line for line in out.splitlines() if line.startswith("GAP:")]
        return code, broken, gaps, out


def test_a_clean_run_passes_and_prints_every_scenario(tmp_path, capsys):
    code, broken, gaps, out = Run(tmp_path).judge(capsys)
    assert (code, broken, gaps) == (0, [], [])
    for name in ("baseline", "restart", "node-crash", "node-lost"):
        assert any(line.startswith(name) for line in out.splitlines()), out
    # The budget column: 0.5% of the restart's 40,000 entries.
    assert " 200 " in next(line for line in out.splitlines() if line.startswith("restart"))


def test_misses_over_the_budget_break_naming_the_budget(tmp_path, capsys):
    run = Run(tmp_path)
    run.rust["restart"] = rust_phase("restart", misses=201)
    code, broken, _, _ = run.judge(capsys)
    assert code == 1
    assert broken == ["BROKEN: restart: 201 misses, over its budget of 200 (0.5% of the "
                      "40000 entries it touches)"]
    run.rust["restart"] = rust_phase("restart", misses=200)
    assert run.judge(capsys)[0] == 0


def test_a_crash_with_one_copy_may_miss_each_lost_entry_once(tmp_path, capsys):
    run = Run(tmp_path)
    run.rust["node-crash"] = rust_phase("node-crash", gets=60_000, misses=6_775)
    assert run.judge(capsys)[0] == 0
    run.rust["node-crash"] = rust_phase("node-crash", gets=60_000, misses=6_776)
    assert run.judge(capsys)[0] == 1


def test_any_failed_rust_call_breaks_even_in_a_crash(tmp_path, capsys):
    run = Run(tmp_path)
    run.rust["node-crash"] = rust_phase("node-crash", errors=1)
    code, broken, _, _ = run.judge(capsys)
    assert code == 1 and len(broken) == 1
    assert "node-crash: 1 failed calls (flightcache-load {'UNAVAILABLE': 1}" in broken[0]


def test_pyarrow_may_lose_its_one_committed_call_only_when_a_process_dies(tmp_path, capsys):
    run = Run(tmp_path)
    run.py["node-crash"] = py_phase(errors=changes_report.PYARROW_LOST_CALLS)
    assert run.judge(capsys)[0] == 0
    run.py["node-crash"] = py_phase(errors=changes_report.PYARROW_LOST_CALLS + 1)
    code, broken, _, _ = run.judge(capsys)
    assert code == 1 and "of which 1 allowed" in broken[0]
    # A planned change has no process dying under a call: no allowance.
    run.py["node-crash"] = py_phase()
    run.py["restart"] = py_phase(errors=1)
    code, broken, _, _ = run.judge(capsys)
    assert code == 1 and broken[0].startswith("BROKEN: restart: 1 failed calls")


def test_a_lost_nodes_failed_calls_are_a_named_gap_not_a_pass_in_silence(tmp_path, capsys):
    run = Run(tmp_path)
    run.rust["node-lost"] = rust_phase("node-lost", errors=3,
                                       by_code={"DEADLINE_EXCEEDED": 3})
    code, broken, gaps, _ = run.judge(capsys)
    assert (code, broken) == (0, [])
    assert len(gaps) == 1 and "heartbeat 20 s overdue" in gaps[0]


def test_tries_after_a_lost_connection_are_bounded_and_none_in_a_planned_change(tmp_path, capsys):
    run = Run(tmp_path)
    bound = changes_report.LOST_CONNECTION_RETRIES
    run.rust["node-crash"] = rust_phase("node-crash", retried=bound)
    assert run.judge(capsys)[0] == 0
    run.rust["node-crash"] = rust_phase("node-crash", retried=bound + 1)
    code, broken, _, _ = run.judge(capsys)
    assert code == 1 and f"more than the {bound} its disruption explains" in broken[0]
    run.rust["node-crash"] = rust_phase("node-crash")
    run.rust["restart"] = rust_phase("restart", retried=1)
    code, broken, _, _ = run.judge(capsys)
    assert code == 1 and "more than the 0 its disruption explains" in broken[0]


def test_pyarrow_tries_the_nodes_counted_are_bounded_like_the_rust_clients(tmp_path, capsys):
    run = Run(tmp_path)
    bound = changes_report.PYARROW_LOST_CONNECTION_TRIES
    run.seen = {"node-crash": (bound, 5), "restart": (0, 0)}
    code, broken, _, out = run.judge(capsys)
    assert (code, broken) == (0, [])
    assert f"{bound}/{bound}" in next(l for l in out.splitlines() if l.startswith("node-crash"))
    run.seen = {"node-crash": (bound + 1, 0), "restart": (1, 0)}
    code, broken, _, _ = run.judge(capsys)
    assert code == 1
    assert any(f"node-crash: the nodes counted {bound + 1} pyarrow calls" in b for b in broken)
    assert any("restart: the nodes counted 1 pyarrow calls tried again, more than the 0" in b
               for b in broken)


def test_hit_ratio_floors_differ_for_planned_changes_and_faults(tmp_path, capsys):
    run = Run(tmp_path)
    # 94% of the steady state: under the planned floor (95%), over the fault floor (60%).
    run.rust["restart"] = rust_phase("restart", hit_ratio=0.94)
    code, broken, _, _ = run.judge(capsys)
    assert code == 1 and "restart: hit ratio 0.9400 is under 95%" in broken[0]
    run.rust["restart"] = rust_phase("restart")
    run.stakes["node-crash"] = (100_000, 1.0)
    run.rust["node-crash"] = rust_phase("node-crash", hit_ratio=0.61)
    assert run.judge(capsys)[0] == 0
    run.py["node-crash"] = py_phase(gets=300, hits=150)
    code, broken, _, _ = run.judge(capsys)
    assert code == 1 and "pyarrow hit ratio 0.5000 is under 60%" in broken[0]


def test_corrupt_reads_and_silent_scenarios_break(tmp_path, capsys):
    run = Run(tmp_path)
    run.corrupt = 1
    run.py["restart"] = py_phase(corrupt=2)
    run.rust["node-lost"] = rust_phase("node-lost", gets=0)
    code, broken, _, _ = run.judge(capsys)
    assert code == 1
    assert "BROKEN: restart: 2 corrupt pyarrow reads" in broken
    assert "BROKEN: node-lost: no traffic" in broken
    assert any("1 corrupt reads" in line for line in broken)


def test_stakes_lines_are_read_by_kind(tmp_path):
    path = tmp_path / "stakes"
    path.write_text("restart stake 40000 0.005\nnode-frozen hung 14\nnoise\n"
                    "node-crash seen 3 11\n")
    stakes, hung = changes_report.read_stakes(str(path))
    assert stakes == {"restart": (40000, 0.005)}
    assert hung == {"node-frozen": 14}
    assert changes_report.read_seen(str(path)) == {"node-crash": (3, 11)}


# ---------------------------------------------------------------- monitoring_check.py


class FakePrometheus:
    """Answers /api/v1/query and /api/v1/alerts from canned results, on 127.0.0.1."""

    def __init__(self):
        self.results = {}  # expr -> (resultType, result) or an error string
        self.alerts = []
        self.asked = []
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (the http.server API)
                from urllib.parse import parse_qs, urlparse

                url = urlparse(self.path)
                if url.path == "/api/v1/alerts":
                    self.answer(200, {"status": "success", "data": {"alerts": owner.alerts}})
                    return
                expr = parse_qs(url.query).get("query", [""])[0]
                owner.asked.append(expr)
                found = owner.results.get(expr, ("vector", []))
                if isinstance(found, str):
                    self.answer(400, {"status": "error", "error": found})
                else:
                    self.answer(200, {"status": "success",
                                      "data": {"resultType": found[0], "result": found[1]}})

            def answer(self, code, body):
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def prom():
    server = FakePrometheus()
    yield server
    server.stop()


def test_queries_count_series_and_non_finite_values(prom):
    prom.results["up"] = ("vector", [{"metric": {}, "value": [0, "1"]},
                                     {"metric": {}, "value": [0, "NaN"]}])
    prom.results["bad("] = "parse error: unclosed left parenthesis"
    prom.results["scalar(1)"] = ("scalar", [0, "1"])
    client = monitoring_check.Prometheus(prom.url)
    assert client.query("up") == (2, 1, "")
    assert client.query("bad(") == (0, 0, "parse error: unclosed left parenthesis")
    assert client.query("scalar(1)") == (1, 0, "")
    assert client.query("absent_series") == (0, 0, "")


def test_an_unreachable_prometheus_is_an_error_not_a_crash():
    # A port nobody listens on (bound, then released).
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    count, bad, error = monitoring_check.Prometheus(f"http://127.0.0.1:{port}").query("up")
    assert (count, bad) == (0, 0) and error


def test_variables_are_substituted_in_every_syntax_and_missing_ones_named():
    expr, missing = monitoring_check.substitute(
        'rate(x{pool="$pool", ns="${namespace}", c="[[cluster]]"}[$__rate_interval]) $nope',
        {"pool": "hot", "namespace": "prod", "cluster": "a", "__rate_interval": "2m"})
    assert expr == 'rate(x{pool="hot", ns="prod", c="a"}[2m]) $nope'
    assert missing == ["nope"]


def test_panels_nested_in_rows_are_all_found():
    dashboard = {"panels": [{"title": "a", "panels": [{"title": "b"}]}],
                 "rows": [{"panels": [{"title": "c"}]}]}
    assert [p["title"] for p in monitoring_check.panels(dashboard)] == ["a", "b", "c"]


def test_label_values_take_prometheus_first_value_and_constants_their_current(prom):
    prom.results['group by (pool) (flightcache_node_entries{namespace="prod"})'] = (
        "vector", [{"metric": {"pool": "warm"}, "value": [0, "1"]},
                   {"metric": {"pool": "hot"}, "value": [0, "1"]}])
    dashboard = {"templating": {"list": [
        {"name": "namespace", "type": "custom", "current": {"value": "prod"}},
        {"name": "pool", "type": "query",
         "query": {"query": 'label_values(flightcache_node_entries{namespace="$namespace"}, pool)'}},
        {"name": "ds", "type": "datasource"},
        {"name": "step", "type": "interval", "options": [{"value": "1m"}]},
    ]}}
    values = monitoring_check.resolve_variables(dashboard, {}, monitoring_check.Prometheus(prom.url))
    assert values["namespace"] == "prod"
    assert values["pool"] == "hot"  # sorted: the first
    assert values["step"] == "1m"
    assert "ds" not in values
    # A value given on the command line wins over the dashboard's.
    given = monitoring_check.resolve_variables(dashboard, {"pool": "cold"},
                                               monitoring_check.Prometheus(prom.url))
    assert given["pool"] == "cold"


def test_alert_state_matches_name_and_labels(prom, capsys):
    prom.alerts = [
        {"labels": {"alertname": "FlightCacheNodeDown", "pool": "hot"}, "state": "pending"},
        {"labels": {"alertname": "FlightCacheNodeDown", "pool": "warm"}, "state": "firing"},
    ]
    for match, want in [(["pool=hot"], "pending"), (["pool=warm"], "firing"),
                        (["pool=cold"], "inactive"), ([], "firing")]:
        sys.argv = ["monitoring_check.py", "alert-state", "--prom", prom.url,
                    "FlightCacheNodeDown", *match]
        assert monitoring_check.main() == 0
        assert capsys.readouterr().out.strip() == want, match


def test_alert_for_reads_durations_and_a_file_without_groups_is_refused(tmp_path, capsys):
    rules = tmp_path / "rules.yaml"
    rules.write_text("groups:\n- name: g\n  rules:\n  - alert: A\n    for: 1m30s\n"
                     "  - alert: B\n    expr: up\n")
    for name, want in [("A", "90"), ("B", "0")]:
        sys.argv = ["monitoring_check.py", "alert-for", "--rules", str(rules), name]
        assert monitoring_check.main() == 0
        assert capsys.readouterr().out.strip() == want
    sys.argv = ["monitoring_check.py", "alert-for", "--rules", str(rules), "C"]
    assert monitoring_check.main() == 1
    assert "no alert C" in capsys.readouterr().err
    assert monitoring_check.seconds("500ms") == 1
    not_rules = tmp_path / "other.yaml"
    not_rules.write_text("kind: ConfigMap\n")
    with pytest.raises(SystemExit, match="no `groups:`"):
        monitoring_check.load_rules(str(not_rules))
