"""The chart's template tests (run by tests/run, which installs the tools).

    chart_tests.py HELM KUBECONFORM K8S_SCHEMAS CRD_SCHEMAS K8S_VERSION

Renders every case of cases.py with `helm template`, asserts on the parsed documents, checks
that every refusal fails with its message, and validates every rendering with kubeconform
(-strict) against the Kubernetes K8S_VERSION schemas and the CRD schemas (CacheCluster from
crds/, ServiceMonitor and PrometheusRule from prometheus-operator's), where no resource may
go unvalidated; renderings the API schemas must refuse prove that they are applied.
Prints every failure and `chart-tests: N passed, N failed`; exits 1 on any failure.
"""

import json
import os
import subprocess
import sys
import tempfile
import traceback
from concurrent.futures import ThreadPoolExecutor

import yaml

LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

import cases

RELEASE = "fc"
NS = {"release": "flightcache-system", "a": "team-a", "b": "team-b", "mon": "monitoring"}


def render(helm, workdir, key, values, extra, chart=cases.CHART):
    path = os.path.join(workdir, f"{key}.values.json")
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(values, fh)
    proc = subprocess.run(
        [helm, "template", RELEASE, chart, "--namespace", NS["release"], "-f", path, *extra],
        capture_output=True, text=True, check=False)
    return proc.returncode, proc.stdout, proc.stderr


def main():
    helm, kubeconform, k8s_schemas, crd_schemas, k8s_version = sys.argv[1:6]
    results = []
    workdir = tempfile.mkdtemp(prefix="chart-tests-")
    renderings = {}  # file -> case name, for kubeconform

    def record(what, ok, detail=""):
        results.append((what, ok, detail))

    jobs = []
    for i, (name, values, extra, check) in enumerate(cases.cases(NS)):
        jobs.append(("case", i, name, values, extra, check))
    reused_chart = cases.reused_values_chart(workdir)
    for i, (name, values, extra, check) in enumerate(cases.reused_values_cases(NS)):
        jobs.append(("reused", i, name, values, extra, check))
    for i, (name, values, kind) in enumerate(cases.invalid_renderings(NS)):
        jobs.append(("invalid", i, name, values, [], kind))
    for i, (name, values, message) in enumerate(cases.refusals(NS)):
        jobs.append(("refusal", i, name, values, [], message))
    with ThreadPoolExecutor(max_workers=8) as pool:
        outputs = list(pool.map(lambda j: render(
            helm, workdir, f"{j[0]}-{j[1]}", j[3], j[4],
            reused_chart if j[0] == "reused" else cases.CHART), jobs))

    invalid_files = {}
    for (what, i, name, _values, _extra, arg), (rc, out, err) in zip(jobs, outputs):
        if what == "refusal":
            record(f"refused: {name}", rc != 0 and arg in err,
                   f"rendered without error (want a failure with {arg!r})" if rc == 0
                   else f"failed, but its message lacks {arg!r}:\n{err.strip()}")
            continue
        if rc != 0:
            record(f"{name}: helm template", False, err.strip())
            continue
        path = os.path.join(workdir, f"{what}-{i}.yaml")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(out)
        if what == "invalid":
            invalid_files[path] = (name, arg)
            continue
        renderings[path] = name
        docs = [d for d in yaml.load_all(out, Loader=LOADER) if d]
        check = cases.Check(name)
        try:
            arg(check, docs, NS, RELEASE)
        except Exception:  # a document the check expected is missing: report, go on
            check.true("checks ran to the end", False, traceback.format_exc(limit=2).strip())
        results.extend(check.results)

    # kubeconform over every rendering at once.
    proc = subprocess.run(
        [kubeconform, "-strict", "-verbose", "-output", "json", "-kubernetes-version", k8s_version,
         "-schema-location",
         os.path.join(k8s_schemas, "{{ .NormalizedKubernetesVersion }}-local{{ .StrictSuffix }}",
                      "{{ .ResourceKind }}{{ .KindSuffix }}.json"),
         "-schema-location", os.path.join(crd_schemas, "{{ .ResourceKind }}_{{ .ResourceAPIVersion }}.json"),
         *renderings, *invalid_files],
        capture_output=True, text=True, check=False)
    try:
        report = json.loads(proc.stdout)["resources"]
    except (ValueError, KeyError):
        record("kubeconform ran", False, (proc.stdout + proc.stderr).strip()[:2000])
        report = []
    by_file = {}
    for res in report:
        by_file.setdefault(res["filename"], []).append(res)
    for path, name in renderings.items():
        res = by_file.get(path, [])
        bad = [f"{r['kind']}/{r['name']}: {r['status']} {r.get('msg', '')}" for r in res
               if r["status"] != "statusValid"]
        record(f"{name}: kubeconform -strict, every resource valid against its schema ({len(res)})",
               bool(res) and not bad, "\n".join(bad) or "no resources reported")
    for path, (name, kind) in invalid_files.items():
        res = by_file.get(path, [])
        refused = [r for r in res if r["kind"] == kind and r["status"] == "statusInvalid"]
        others = [r for r in res if r["kind"] != kind and r["status"] != "statusValid"]
        record(f"kubeconform refuses {kind}: {name}", bool(refused) and not others,
               json.dumps([{k: r.get(k) for k in ("kind", "status", "msg")} for r in res if r["status"] != "statusValid"]))

    failed = cases.report(results)
    subprocess.run(["rm", "-rf", workdir], check=False)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
