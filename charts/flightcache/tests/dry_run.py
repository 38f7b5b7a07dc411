"""Applies every rendering of cases.py to a real API server with `kubectl apply
--dry-run=server --validate=strict` (run by tests/dry-run, which checks the arguments).

    dry_run.py HELM KUBECTL

KUBECONFIG names the cluster. Side effects, all undone at the end: the chart's CRDs are
applied for real (server-side, as e2e/lib/deploy.sh does) and deleted again only if they did
not exist before; four namespaces fc-chart-<id>[-a|-b|-mon], labelled
flightcache.dev/test=chart-dry-run, are created and deleted. Nothing else is written: the
renderings are only dry-run. Every rendering must be accepted whole (one "(server dry run)"
line per document); the invalid renderings of cases.py must be refused by the API server
(proving the dry run validates); the ServiceMonitor and PrometheusRule are applied only where
the cluster serves monitoring.coreos.com/v1 (otherwise left out and reported).
Prints every failure and `chart-tests: N passed, N failed`; exits 1 on any failure.
"""

import glob
import json
import os
import secrets
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

import yaml

import cases

LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
MONITORING_KINDS = {"ServiceMonitor", "PrometheusRule"}
TEST_LABEL = "flightcache.dev/test=chart-dry-run"


def main():
    helm, kubectl = sys.argv[1:3]
    workdir = tempfile.mkdtemp(prefix="chart-dry-run-")
    # A private discovery cache: the CRDs applied below are seen at once.
    kc = [kubectl, "--cache-dir", os.path.join(workdir, "kube-cache")]
    run_id = secrets.token_hex(3)
    release = f"fc-chart-{run_id}"
    ns = {"release": release, "a": f"{release}-a", "b": f"{release}-b", "mon": f"{release}-mon"}
    results = []

    def record(what, ok, detail=""):
        results.append((what, ok, detail))

    def sh(*cmd, stdin=None):
        return subprocess.run(list(cmd), input=stdin, capture_output=True, text=True, check=False)

    crd_files = sorted(glob.glob(os.path.join(cases.CHART, "crds", "*.yaml")))
    crd_names = []
    for path in crd_files:
        with open(path, encoding="utf-8") as fh:
            crd_names += [d["metadata"]["name"] for d in yaml.load_all(fh, Loader=LOADER)
                          if d and d.get("kind") == "CustomResourceDefinition"]
    server = sh(*kc, "config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}").stdout
    print(f"chart dry run against {server or '(no server in KUBECONFIG)'}: namespaces {release}[-a|-b|-mon]")
    existing = [n for n in crd_names if sh(*kc, "get", "crd", n, "-o", "name").returncode == 0]
    created_crds = [n for n in crd_names if n not in existing]
    try:
        proc = sh(*kc, "apply", "--server-side", "--force-conflicts", *sum((["-f", f] for f in crd_files), []))
        record("the chart's CRDs apply", proc.returncode == 0, proc.stderr.strip())
        proc = sh(*kc, "wait", "--for=condition=Established", "--timeout=60s",
                  *[f"crd/{n}" for n in crd_names])
        record("the chart's CRDs are Established", proc.returncode == 0, proc.stderr.strip())
        for name in ns.values():
            manifest = json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {
                "name": name, "labels": dict([TEST_LABEL.split("=")])}})
            proc = sh(*kc, "create", "-f", "-", stdin=manifest)
            record(f"namespace {name} created", proc.returncode == 0, proc.stderr.strip())
        monitoring_served = "monitoring.coreos.com/v1" in sh(*kc, "api-versions").stdout.split()

        def render(key, values, extra):
            path = os.path.join(workdir, f"{key}.values.json")
            with open(path, "w", encoding="utf-8") as fh:
                json.dump(values, fh)
            return sh(helm, "template", release, cases.CHART, "--namespace", ns["release"], "-f", path, *extra)

        def dry_run(key, text):
            path = os.path.join(workdir, f"{key}.yaml")
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text)
            return sh(*kc, "apply", "--dry-run=server", "--validate=strict", "-f", path)

        def one_case(job):
            i, (name, values, extra, _check) = job
            proc = render(f"case-{i}", values, extra)
            if proc.returncode != 0:
                return [(f"{name}: helm template", False, proc.stderr.strip())], None
            docs = [d for d in yaml.load_all(proc.stdout, Loader=LOADER) if d]
            left_out = sorted({d["kind"] for d in docs if d["kind"] in MONITORING_KINDS and not monitoring_served})
            docs = [d for d in docs if d["kind"] not in left_out]
            note = (f"  {name}: {', '.join(left_out)} left out: the cluster does not serve "
                    "monitoring.coreos.com/v1") if left_out else None
            applied = dry_run(f"case-{i}", yaml.safe_dump_all(docs))
            accepted = [line for line in applied.stdout.splitlines() if line.endswith("(server dry run)")]
            return [(f"{name}: the API server accepts all {len(docs)} objects (dry run, strict)",
                     applied.returncode == 0 and len(accepted) == len(docs),
                     (applied.stderr.strip() or applied.stdout.strip())[:3000])], note

        def one_invalid(job):
            i, (name, values, kind) = job
            proc = render(f"invalid-{i}", values, [])
            if proc.returncode != 0:
                return [(f"invalid rendering {name}: helm template", False, proc.stderr.strip())], None
            applied = dry_run(f"invalid-{i}", proc.stdout)
            return [(f"the API server refuses the {kind}: {name}",
                     applied.returncode != 0 and kind.lower() in applied.stderr.lower(),
                     f"rc {applied.returncode}: {(applied.stderr or applied.stdout).strip()[:2000]}")], None

        with ThreadPoolExecutor(max_workers=4) as pool:
            done = list(pool.map(one_case, enumerate(cases.cases(ns))))
            done += list(pool.map(one_invalid, enumerate(cases.invalid_renderings(ns))))
        for checks, note in done:
            results.extend(checks)
            if note:
                print(note)
    finally:
        proc = sh(*kc, "delete", "namespace", *ns.values(), "--ignore-not-found", "--wait=true", "--timeout=120s")
        record("the test namespaces are deleted", proc.returncode == 0, proc.stderr.strip())
        if created_crds:
            proc = sh(*kc, "delete", "crd", *created_crds, "--ignore-not-found", "--wait=true", "--timeout=120s")
            record(f"the CRDs this run created are deleted ({', '.join(created_crds)})",
                   proc.returncode == 0, proc.stderr.strip())
        else:
            print(f"  the CRDs existed before ({', '.join(existing)}): applied, and left in place")
        subprocess.run(["rm", "-rf", workdir], check=False)

    failed = cases.report(results)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
