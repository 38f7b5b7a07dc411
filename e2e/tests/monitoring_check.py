"""What e2e/tests/monitoring asks a real Prometheus, read from the project's own files at run
time (the Grafana dashboards and the Prometheus rule file), so a new panel or rule is checked
without changing the test. Standard library plus PyYAML (Debian python3-yaml). Usage:

    monitoring_check.py queries --prom URL [--dashboard FILE]... [--rules FILE]
                                [--var NAME=VALUE]... [--timeout SECONDS]
        every panel query of every dashboard (template variables substituted) and every
        recording rule's series must return non-empty, finite data; polls until they all do
        or the timeout passes, then prints each query with its result count and exits 1
        listing the ones that did not
    monitoring_check.py rules-loaded --prom URL --rules FILE
        every group, recording rule and alert of FILE is loaded in Prometheus
    monitoring_check.py alert-state --prom URL NAME [LABEL=VALUE]...
        prints the alert's state: firing, pending or inactive (no active alert matches)
    monitoring_check.py alert-for --rules FILE NAME
        prints the alert's `for` in seconds (0 when it has none)
"""

import argparse
import json
import math
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import yaml

# Grafana's built-in variables, with values for an instant query over a short test run:
# $__rate_interval is at least four scrape intervals in Grafana; the node ServiceMonitor
# scrapes every 30 s at most, so 2m always holds enough samples for rate().
BUILTINS = {
    "__rate_interval": "2m",
    "__interval": "30s",
    "__interval_ms": "30000",
    "__range": "5m",
    "__range_s": "300",
    "__range_ms": "300000",
}
VARIABLE = re.compile(r"\$\{(\w+)(?::[\w]+)?\}|\[\[(\w+)(?::[\w]+)?\]\]|\$(\w+)")
LABEL_VALUES = re.compile(r"^\s*label_values\((?:(.*),\s*)?(\w+)\)\s*$", re.S)


class Prometheus:
    def __init__(self, url: str):
        self.url = url.rstrip("/")

    def get(self, path: str, **params) -> dict:
        query = urllib.parse.urlencode(params)
        url = f"{self.url}{path}" + (f"?{query}" if query else "")
        try:
            with urllib.request.urlopen(url, timeout=15) as response:
                body = json.load(response)
        except urllib.error.HTTPError as err:
            body = json.loads(err.read() or b"{}")
            return {"status": "error", "error": body.get("error", str(err))}
        except (urllib.error.URLError, TimeoutError, ConnectionError) as err:
            return {"status": "error", "error": str(err)}
        return body

    def query(self, expr: str) -> tuple[int, int, str]:
        """(series returned, series with a non-finite value, error or '')."""
        body = self.get("/api/v1/query", query=expr)
        if body.get("status") != "success":
            return 0, 0, body.get("error", "query failed")
        data = body["data"]
        if data["resultType"] == "scalar":
            values = [data["result"][1]]
        elif data["resultType"] == "vector":
            values = [sample["value"][1] for sample in data["result"]]
        elif data["resultType"] == "matrix":
            values = [series["values"][-1][1] for series in data["result"] if series["values"]]
        else:
            return 0, 0, f"unexpected result type {data['resultType']}"
        return len(values), sum(1 for v in values if not math.isfinite(float(v))), ""


def panels(container: dict):
    """Every panel, including those nested in rows (collapsed rows hold their own)."""
    for panel in container.get("panels", []):
        yield panel
        yield from panels(panel)
    for row in container.get("rows", []):  # the pre-5.0 layout
        yield from panels(row)


def substitute(expr: str, values: dict) -> tuple[str, list[str]]:
    missing = []

    def one(match: re.Match) -> str:
        name = match.group(1) or match.group(2) or match.group(3)
        if name in values:
            return values[name]
        missing.append(name)
        return match.group(0)

    return VARIABLE.sub(one, expr), missing


def resolve_variables(dashboard: dict, given: dict, prom: Prometheus) -> dict:
    """The values of the dashboard's template variables: those given on the command line
    win; a `label_values(...)` query takes the first value Prometheus returns; a constant,
    custom or interval variable takes its current value or first option."""
    values = dict(BUILTINS)
    values.update(given)
    for var in dashboard.get("templating", {}).get("list", []):
        name = var.get("name")
        if not name or name in values or var.get("type") == "datasource":
            continue
        query = var.get("query")
        if isinstance(query, dict):
            query = query.get("query", "")
        match = LABEL_VALUES.match(query or "") if var.get("type") == "query" else None
        if match:
            selector, label = match.group(1), match.group(2)
            selector, _ = substitute(selector or "", values)
            selector = selector or "{%s!=\"\"}" % label
            expr = f"group by ({label}) ({selector})"
            body = prom.get("/api/v1/query", query=expr)
            found = sorted(
                s["metric"].get(label, "") for s in body.get("data", {}).get("result", [])
            ) if body.get("status") == "success" else []
            if found:
                values[name] = found[0]
            continue
        current = var.get("current", {}).get("value")
        if isinstance(current, list):
            current = current[0] if current else None
        if current and current != "$__all":
            values[name] = str(current)
        elif var.get("options"):
            values[name] = str(var["options"][0].get("value"))
    return values


def dashboard_queries(path: str, given: dict, prom: Prometheus):
    with open(path, encoding="utf-8") as fh:
        dashboard = json.load(fh)
    dashboard = dashboard.get("dashboard", dashboard)  # an API export wraps it
    values = resolve_variables(dashboard, given, prom)
    title = dashboard.get("title", path)
    for panel in panels(dashboard):
        for target in panel.get("targets", []) or []:
            expr = target.get("expr")
            if not expr:
                continue
            expr, missing = substitute(expr, values)
            name = f"{title} / {panel.get('title', '?')} / {target.get('refId', '?')}"
            yield name, expr, missing


def load_rules(path: str) -> dict:
    with open(path, encoding="utf-8") as fh:
        rules = yaml.safe_load(fh) or {}
    if "groups" not in rules:
        raise SystemExit(f"{path}: no `groups:` (expected a Prometheus rule file)")
    return rules


def recording_queries(path: str):
    for group in load_rules(path)["groups"]:
        for rule in group.get("rules", []):
            if "record" in rule:
                yield f"rule {group['name']} / {rule['record']}", rule["record"], []


def cmd_queries(args) -> int:
    prom = Prometheus(args.prom)
    given = dict(v.split("=", 1) for v in args.var)
    checks = []
    for path in args.dashboard:
        checks.extend(dashboard_queries(path, given, prom))
    if args.rules:
        checks.extend(recording_queries(args.rules))
    if not checks:
        print("no query to check (no dashboard panel with an expr, no recording rule)")
        return 1
    deadline = time.monotonic() + args.timeout
    while True:
        results = []
        for name, expr, missing in checks:
            if missing:
                results.append((name, expr, 0, 0, f"unknown variables {', '.join(sorted(set(missing)))}"))
                continue
            count, non_finite, error = prom.query(expr)
            results.append((name, expr, count, non_finite, error))
        bad = [r for r in results if r[4] or r[2] == 0 or r[3] > 0]
        if not bad or time.monotonic() >= deadline:
            break
        # Say what is still awaited, so a slow run shows which query holds it up.
        waited = args.timeout - (deadline - time.monotonic())
        print(f"[{waited:5.0f}s] waiting for {len(bad)} of {len(results)}: "
              + "; ".join(r[0] for r in bad[:6]) + (" ..." if len(bad) > 6 else ""),
              file=sys.stderr, flush=True)
        time.sleep(5)
    for name, expr, count, non_finite, error in results:
        verdict = (
            f"ERROR {error}" if error else
            "EMPTY" if count == 0 else
            f"NON-FINITE {non_finite} of {count}" if non_finite else
            "ok"
        )
        print(f"{verdict:<22} {count:>4} series  {name}\n{'':<28}{' '.join(expr.split())}")
    print(f"{len(results) - len(bad)} of {len(results)} queries returned non-empty, finite data")
    if bad:
        print("queries without non-empty, finite data:")
        for name, *_ in bad:
            print(f"  {name}")
        return 1
    return 0


def cmd_rules_loaded(args) -> int:
    prom = Prometheus(args.prom)
    body = prom.get("/api/v1/rules")
    if body.get("status") != "success":
        print(f"GET /api/v1/rules: {body.get('error')}")
        return 1
    loaded = {
        (rule.get("name"), rule.get("type"))
        for group in body["data"]["groups"]
        for rule in group["rules"]
    }
    missing = []
    wanted = 0
    for group in load_rules(args.rules)["groups"]:
        for rule in group.get("rules", []):
            wanted += 1
            key = (rule["record"], "recording") if "record" in rule else (rule.get("alert"), "alerting")
            if key not in loaded:
                missing.append(f"{key[1]} {key[0]}")
    if missing:
        print("not loaded in Prometheus: " + ", ".join(missing))
        return 1
    print(f"all {wanted} rules of {args.rules} are loaded")
    return 0


def cmd_alert_state(args) -> int:
    body = Prometheus(args.prom).get("/api/v1/alerts")
    if body.get("status") != "success":
        print(f"GET /api/v1/alerts: {body.get('error')}", file=sys.stderr)
        return 1
    want = dict(m.split("=", 1) for m in args.match)
    states = {
        alert["state"]
        for alert in body["data"]["alerts"]
        if alert["labels"].get("alertname") == args.name
        and all(alert["labels"].get(k) == v for k, v in want.items())
    }
    print("firing" if "firing" in states else "pending" if "pending" in states else "inactive")
    return 0


def seconds(duration: str) -> int:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    total = 0.0
    for number, unit in re.findall(r"(\d+)(ms|s|m|h|d|w|y)", duration):
        total += int(number) * units[unit]
    return math.ceil(total)


def cmd_alert_for(args) -> int:
    for group in load_rules(args.rules)["groups"]:
        for rule in group.get("rules", []):
            if rule.get("alert") == args.name:
                print(seconds(str(rule.get("for", "0s"))))
                return 0
    print(f"{args.rules}: no alert {args.name}", file=sys.stderr)
    return 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("queries")
    p.add_argument("--prom", required=True)
    p.add_argument("--dashboard", action="append", default=[])
    p.add_argument("--rules")
    p.add_argument("--var", action="append", default=[])
    p.add_argument("--timeout", type=float, default=240)
    p.set_defaults(func=cmd_queries)
    p = sub.add_parser("rules-loaded")
    p.add_argument("--prom", required=True)
    p.add_argument("--rules", required=True)
    p.set_defaults(func=cmd_rules_loaded)
    p = sub.add_parser("alert-state")
    p.add_argument("--prom", required=True)
    p.add_argument("name")
    p.add_argument("match", nargs="*")
    p.set_defaults(func=cmd_alert_state)
    p = sub.add_parser("alert-for")
    p.add_argument("--rules", required=True)
    p.add_argument("name")
    p.set_defaults(func=cmd_alert_for)
    args = parser.parse_args()
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
