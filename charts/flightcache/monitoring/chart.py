"""Checks what the chart renders for monitoring against the committed sources.

    chart.py on RENDERED.yaml DASHBOARDS_DIR RULES.yaml
        RENDERED is `helm template` with dashboards, prometheusRule and serviceMonitor on:
        exactly one ConfigMap labelled grafana_dashboard: "1" per DASHBOARDS_DIR/*.json, whose
        only data entry is that file byte for byte (less the final newline the `|-` block
        drops) and equal to it as JSON; one PrometheusRule whose spec is exactly the groups
        of RULES; one ServiceMonitor that selects the operator's metrics Service (rendered
        too) on its `metrics` port.
    chart.py off RENDERED.yaml
        RENDERED is `helm template` with the default values: none of those objects.

Prints a one-line summary; on any difference prints every one of them and exits 1.
"""

import glob
import json
import os
import sys

import yaml


def load(path):
    with open(path, encoding="utf-8") as fh:
        return [doc for doc in yaml.safe_load_all(fh) if doc]


def dashboard_configmaps(docs):
    return [
        d for d in docs
        if d.get("kind") == "ConfigMap"
        and (d.get("metadata", {}).get("labels") or {}).get("grafana_dashboard") == "1"
    ]


def of_kind(docs, kind):
    return [d for d in docs if d.get("kind") == kind]


def first_difference(a, b):
    a_lines, b_lines = a.split("\n"), b.split("\n")
    for i, (x, y) in enumerate(zip(a_lines, b_lines)):
        if x != y:
            return f"line {i + 1}: rendered {x.strip()[:100]!r}, committed {y.strip()[:100]!r}"
    return f"rendered has {len(a_lines)} lines, committed {len(b_lines)}"


def check_dashboards(docs, dashboards_dir, errors):
    committed = {}
    for path in sorted(glob.glob(os.path.join(dashboards_dir, "*.json"))):
        with open(path, encoding="utf-8") as fh:
            committed[os.path.basename(path)] = fh.read()
    if not committed:
        errors.append(f"no dashboard JSON in {dashboards_dir}")
    rendered = {}
    for cm in dashboard_configmaps(docs):
        name = cm["metadata"]["name"]
        data = cm.get("data") or {}
        if len(data) != 1:
            errors.append(f"ConfigMap {name}: {len(data)} data entries, want 1 dashboard")
        for key, text in data.items():
            # The template names each entry flightcache-<file>.
            file = key.removeprefix("flightcache-")
            if file in rendered:
                errors.append(f"dashboard {file} rendered twice (ConfigMap {name})")
            rendered[file] = (name, text)
    for file in sorted(set(committed) - set(rendered)):
        errors.append(f"dashboards/{file}: no ConfigMap labelled grafana_dashboard: \"1\" renders it "
                      "(templates/dashboards.yaml lists the dashboards by name)")
    for file in sorted(set(rendered) - set(committed)):
        errors.append(f"ConfigMap {rendered[file][0]} renders {file}, which is not in dashboards/")
    for file in sorted(set(rendered) & set(committed)):
        name, text = rendered[file]
        want = committed[file].removesuffix("\n")
        if text != want:
            errors.append(f"ConfigMap {name} ({file}) differs from dashboards/{file}: "
                          + first_difference(text, want))
            continue
        try:
            if json.loads(text) != json.loads(committed[file]):
                errors.append(f"ConfigMap {name} ({file}): JSON differs from dashboards/{file}")
        except json.JSONDecodeError as err:
            errors.append(f"ConfigMap {name} ({file}): not JSON: {err}")
    return len(rendered)


def check_prometheusrule(docs, rules_path, errors):
    rules = of_kind(docs, "PrometheusRule")
    if len(rules) != 1:
        errors.append(f"{len(rules)} PrometheusRules rendered, want 1")
        return 0
    rule = rules[0]
    if rule.get("apiVersion") != "monitoring.coreos.com/v1":
        errors.append(f"PrometheusRule apiVersion {rule.get('apiVersion')!r}, want monitoring.coreos.com/v1")
    with open(rules_path, encoding="utf-8") as fh:
        want = yaml.safe_load(fh)
    spec = rule.get("spec") or {}
    if sorted(spec) != sorted(want):
        errors.append(f"PrometheusRule spec keys {sorted(spec)}, {os.path.basename(rules_path)} has {sorted(want)}")
    got_groups = {g.get("name"): g for g in spec.get("groups") or []}
    want_groups = {g.get("name"): g for g in want.get("groups") or []}
    if [g.get("name") for g in spec.get("groups") or []] != [g.get("name") for g in want.get("groups") or []]:
        errors.append("PrometheusRule groups "
                      f"{[g.get('name') for g in spec.get('groups') or []]}, rules.yaml has "
                      f"{[g.get('name') for g in want.get('groups') or []]}")
    for name in sorted(set(got_groups) & set(want_groups)):
        got, exp = got_groups[name], want_groups[name]
        if got == exp:
            continue
        got_rules = {r.get("record") or r.get("alert"): r for r in got.get("rules") or []}
        exp_rules = {r.get("record") or r.get("alert"): r for r in exp.get("rules") or []}
        changed = sorted(k for k in set(got_rules) | set(exp_rules) if got_rules.get(k) != exp_rules.get(k))
        errors.append(f"PrometheusRule group {name} differs from rules.yaml in: {', '.join(map(str, changed)) or 'group fields'}")
    return len(want_groups)


def check_servicemonitor(docs, errors):
    monitors = of_kind(docs, "ServiceMonitor")
    if len(monitors) != 1:
        errors.append(f"{len(monitors)} ServiceMonitors rendered, want 1 (the operator's)")
        return
    sm = monitors[0]
    selector = (sm.get("spec", {}).get("selector") or {}).get("matchLabels") or {}
    services = [
        s for s in of_kind(docs, "Service")
        if selector and all((s["metadata"].get("labels") or {}).get(k) == v for k, v in selector.items())
    ]
    if len(services) != 1:
        errors.append(f"the ServiceMonitor's selector {selector} matches {len(services)} rendered Services, "
                      "want 1 (the operator's metrics Service)")
        return
    service_ports = {p.get("name") for p in services[0].get("spec", {}).get("ports") or []}
    for endpoint in sm.get("spec", {}).get("endpoints") or [{}]:
        if endpoint.get("port") not in service_ports:
            errors.append(f"ServiceMonitor endpoint port {endpoint.get('port')!r} is not a port of "
                          f"Service {services[0]['metadata']['name']} ({sorted(service_ports)})")


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    errors = []
    if mode == "on" and len(sys.argv) == 5:
        docs = load(sys.argv[2])
        dashboards = check_dashboards(docs, sys.argv[3], errors)
        groups = check_prometheusrule(docs, sys.argv[4], errors)
        check_servicemonitor(docs, errors)
        summary = (f"{dashboards} dashboard ConfigMaps identical to dashboards/*.json, "
                   f"PrometheusRule with the {groups} groups of rules.yaml, operator ServiceMonitor")
    elif mode == "off" and len(sys.argv) == 3:
        docs = load(sys.argv[2])
        for cm in dashboard_configmaps(docs):
            errors.append(f"default values render dashboard ConfigMap {cm['metadata']['name']}")
        for kind in ("PrometheusRule", "ServiceMonitor"):
            for d in of_kind(docs, kind):
                errors.append(f"default values render {kind} {d['metadata']['name']}")
        summary = "defaults render none of them"
    else:
        print(__doc__, file=sys.stderr)
        return 2
    for error in errors:
        print(f"chart: {error}", file=sys.stderr)
    if errors:
        return 1
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
