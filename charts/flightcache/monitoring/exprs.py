"""Lists every PromQL query of dashboard JSON files, with Grafana variables substituted.

    exprs.py [--var NAME=VALUE]... [--rules] DASHBOARD.json...

Without --rules: one JSON object per line, {"dashboard", "panel", "ref", "expr"}, e.g. to
run a query by hand (the e2e test against a real Prometheus reads the dashboards with
e2e/tests/monitoring_check.py instead). With --rules: a Prometheus rule file with one
recording rule per query, so `promtool check rules` checks their syntax. Variable queries
(`label_values(SELECTOR, label)`) contribute their SELECTOR. Variables without a --var become
`.*` (`$__rate_interval` and other interval variables `5m`). Pure: reads the files, prints to
stdout.
"""

import json
import re
import sys

INTERVALS = {"__rate_interval": "5m", "__interval": "1m", "__range": "1h"}
VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")
LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*\w+\s*\)\s*$", re.S)


def substitute(expr, values):
    def one(match):
        name = match.group(1) or match.group(2)
        if name in values:
            return values[name]
        return INTERVALS.get(name, ".*")

    return VARIABLE.sub(one, expr)


def panel_queries(panels):
    for panel in panels:
        yield from panel_queries(panel.get("panels", []))
        for target in panel.get("targets", []):
            if "expr" in target:
                yield panel.get("title", ""), target.get("refId", ""), target["expr"]


def variable_queries(board):
    for variable in board.get("templating", {}).get("list", []):
        if variable.get("type") != "query":
            continue
        query = variable.get("query")
        text = query.get("query", "") if isinstance(query, dict) else str(query)
        match = LABEL_VALUES.match(text)
        yield f"variable {variable.get('name')}", "", match.group(1) if match else text


def collect(paths, values):
    for path in paths:
        with open(path, encoding="utf-8") as file:
            board = json.load(file)
        title = board.get("title", path)
        for panel, ref, expr in list(panel_queries(board.get("panels", []))) + list(
            variable_queries(board)
        ):
            yield {"dashboard": title, "panel": panel, "ref": ref,
                   "expr": substitute(expr, values)}


def main(argv):
    values, paths, rules = {}, [], False
    args = iter(argv[1:])
    for arg in args:
        if arg == "--rules":
            rules = True
        elif arg == "--var":
            name, sep, value = next(args, "").partition("=")
            if not sep or not name:
                sys.stderr.write("exprs.py: --var needs NAME=VALUE\n")
                return 2
            values[name] = value
        else:
            paths.append(arg)
    if not paths:
        sys.stderr.write(__doc__)
        return 2
    queries = list(collect(paths, values))
    if rules:
        # JSON is YAML: a rule file promtool reads, one recording rule per query.
        group = {"name": "dashboard-queries", "rules": [
            {"record": f"dashboard_query_{i}", "expr": q["expr"]} for i, q in enumerate(queries)
        ]}
        print(json.dumps({"groups": [group]}, indent=1))
    else:
        for query in queries:
            print(json.dumps(query))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
