"""The chart's documented values combinations, what each must render, and the values the
chart must refuse. Shared by chart_tests.py (helm template + kubeconform) and dry_run.py
(the same renderings applied with kubectl apply --dry-run=server).

A case's values and checks take the namespaces they run in (`ns`: release, a, b, mon), so the
dry run can use fresh namespaces. Checks assert specific values of the parsed documents.
"""

import os
import shutil
import tarfile

import yaml

CHART = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(os.path.dirname(CHART))

with open(os.path.join(CHART, "Chart.yaml"), encoding="utf-8") as _fh:
    _CHART_YAML = yaml.safe_load(_fh)
APP_VERSION = str(_CHART_YAML["appVersion"])
CHART_VERSION = str(_CHART_YAML["version"])

SELECTOR = {"app.kubernetes.io/name": "flightcache-operator"}

# The last released chart, as e2e/tests/chart-upgrade installs it before upgrading.
PREVIOUS_CHART = os.path.join(ROOT, "e2e", "charts", "flightcache-0.1.0.tgz")


def example_spec(name):
    with open(os.path.join(ROOT, "docs", "examples", name), encoding="utf-8") as fh:
        return yaml.safe_load(fh)["spec"]


class Check:
    """Records each assertion of a case: a description and whether it held."""

    def __init__(self, case):
        self.case = case
        self.results = []

    def eq(self, what, got, want):
        ok = got == want
        self.results.append((f"{self.case}: {what}", ok, "" if ok else f"got {got!r}, want {want!r}"))

    def true(self, what, cond, detail=""):
        self.results.append((f"{self.case}: {what}", bool(cond), "" if cond else detail))


# --- reading a rendering -------------------------------------------------------------------

def of_kind(docs, kind):
    return [d for d in docs if d.get("kind") == kind]


def named(docs, kind, name, namespace=None):
    found = [d for d in of_kind(docs, kind) if d["metadata"]["name"] == name
             and (namespace is None or d["metadata"].get("namespace") == namespace)]
    return found[0] if len(found) == 1 else None


def deployment(docs):
    found = of_kind(docs, "Deployment")
    return found[0] if len(found) == 1 else None


def pod_spec(docs):
    return deployment(docs)["spec"]["template"]["spec"]


def args(docs):
    return pod_spec(docs)["containers"][0]["args"]


def selector(release):
    return {**SELECTOR, "app.kubernetes.io/instance": release}


def kinds(docs):
    counts = {}
    for d in docs:
        counts[d["kind"]] = counts.get(d["kind"], 0) + 1
    return counts


def rules_of(docs):
    """(kind/name, rule) for every rule of every Role and ClusterRole."""
    for d in of_kind(docs, "Role") + of_kind(docs, "ClusterRole"):
        for rule in d.get("rules") or []:
            yield f"{d['kind']}/{d['metadata']['name']}", rule


# --- checks shared by cases ------------------------------------------------------------

def check_rolling(c, docs):
    c.eq("strategy (a standby is Ready, so the new pod surges and the old one goes)",
         deployment(docs)["spec"].get("strategy"),
         {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}})


def check_operator_rbac(c, docs, release):
    full = f"{release}-operator"
    grants = {}
    wildcards = []
    for where, rule in rules_of(docs):
        for resource in rule.get("resources", []):
            for group in rule.get("apiGroups", []):
                grants.setdefault((group, resource), set()).update(rule.get("verbs", []))
        if any("*" in rule.get(field, []) for field in ("verbs", "resources", "apiGroups")):
            wildcards.append(f"{where}: {rule}")
    c.eq("no Role or ClusterRole rule grants a wildcard", wildcards, [])
    c.eq("the operator may not create (nor update) CacheInvalidations: get, list, watch, delete only",
         sorted(grants.get(("flightcache.dev", "cacheinvalidations"), set())),
         ["delete", "get", "list", "watch"])
    c.eq("CacheClusters are read-only (status apart)",
         sorted(grants.get(("flightcache.dev", "cacheclusters"), set())), ["get", "list", "watch"])
    c.eq("Secrets: get, create and update only (never list, watch, delete; update renews issued certificates)",
         sorted(grants.get(("", "secrets"), set())), ["create", "get", "update"])
    c.true("the ClusterRole with the namespaced rules exists", named(docs, "ClusterRole", full) is not None)


def check_secret_write_policy(c, docs, ns, release):
    full = f"{release}-operator"
    policy = named(docs, "ValidatingAdmissionPolicy", f"{full}-secret-writes")
    c.true("a policy on the operator's Secret writes", policy is not None)
    if not policy:
        return
    spec = policy["spec"]
    c.eq("it denies (binding)",
         [b["spec"] for b in of_kind(docs, "ValidatingAdmissionPolicyBinding")],
         [{"policyName": f"{full}-secret-writes", "validationActions": ["Deny"]}])
    c.eq("it looks at Secret creates and updates",
         spec["matchConstraints"]["resourceRules"],
         [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
           "resources": ["secrets"]}])
    c.eq("by the operator's ServiceAccount only",
         [m["expression"] for m in spec["matchConditions"]],
         [f'request.userInfo.username == "system:serviceaccount:{ns["release"]}:{full}"'])
    c.eq("fails closed", spec["failurePolicy"], "Fail")
    expressions = " ".join(v["expression"] for v in spec["validations"])
    c.true("the Secret and, on update, its old version owned by a CacheCluster",
           'object.metadata.ownerReferences.exists(r, r.kind == "CacheCluster"' in expressions
           and 'oldObject.metadata.ownerReferences.exists(r, r.kind == "CacheCluster"' in expressions,
           expressions)


def rolebindings_named(docs, name):
    return sorted(d["metadata"]["namespace"] for d in of_kind(docs, "RoleBinding")
                  if d["metadata"]["name"] == name)


# --- the cases -----------------------------------------------------------------------------

def case_defaults(c, docs, ns, release):
    full = f"{release}-operator"
    c.eq("objects by kind", kinds(docs), {
        "ServiceAccount": 1, "ClusterRole": 3, "ClusterRoleBinding": 2, "Role": 2,
        "RoleBinding": 3, "Deployment": 1, "Service": 1,
        "ValidatingAdmissionPolicy": 1, "ValidatingAdmissionPolicyBinding": 1})
    check_secret_write_policy(c, docs, ns, release)
    dep = deployment(docs)
    c.eq("replicas", dep["spec"]["replicas"], 1)
    check_rolling(c, docs)
    c.eq("pod labels are the selector", dep["spec"]["template"]["metadata"]["labels"], selector(release))
    c.eq("Deployment selector", dep["spec"]["selector"]["matchLabels"], selector(release))
    c.true("no pod annotations", "annotations" not in dep["spec"]["template"]["metadata"])
    spec = pod_spec(docs)
    c.true("no imagePullSecrets", "imagePullSecrets" not in spec, spec.get("imagePullSecrets"))
    c.true("no priorityClassName", "priorityClassName" not in spec, spec.get("priorityClassName"))
    c.true("no affinity with one replica", "affinity" not in spec, spec.get("affinity"))
    c.eq("image", spec["containers"][0]["image"], f"flightcache/operator:{APP_VERSION}")
    c.true("leader election on", "--leader-election=true" in args(docs), args(docs))
    c.true("watches the release namespace", f"--watch-namespace={ns['release']}" in args(docs), args(docs))
    c.eq("RoleBinding of the operator's rules: the release namespace only",
         rolebindings_named(docs, full), [ns["release"]])
    c.true("no ClusterRoleBinding of the operator's rules", named(docs, "ClusterRoleBinding", full) is None)
    check_operator_rbac(c, docs, release)
    leader = named(docs, "Role", f"{full}-leader", ns["release"])
    c.eq("leader Role: its Lease only", leader and leader["rules"],
         [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}])
    for kind in ("PodDisruptionBudget", "NetworkPolicy", "CacheCluster", "ConfigMap",
                 "ServiceMonitor", "PrometheusRule"):
        c.eq(f"no {kind}", len(of_kind(docs, kind)), 0)


def case_replicas_2(c, docs, ns, release):
    dep = deployment(docs)
    c.eq("replicas", dep["spec"]["replicas"], 2)
    check_rolling(c, docs)
    pdbs = of_kind(docs, "PodDisruptionBudget")
    c.eq("one PodDisruptionBudget", len(pdbs), 1)
    if pdbs:
        pdb = pdbs[0]
        c.eq("PDB name and namespace", (pdb["metadata"]["name"], pdb["metadata"]["namespace"]),
             (f"{release}-operator", ns["release"]))
        c.eq("PDB spec", pdb["spec"], {"maxUnavailable": 1, "unhealthyPodEvictionPolicy": "AlwaysAllow",
                                       "selector": {"matchLabels": selector(release)}})
    terms = dep["spec"]["template"]["spec"].get("affinity", {}).get("podAntiAffinity", {}) \
        .get("preferredDuringSchedulingIgnoredDuringExecution", [])
    c.eq("preferred anti-affinity over hostname, then zone",
         [(t["weight"], t["podAffinityTerm"]["topologyKey"]) for t in terms],
         [(100, "kubernetes.io/hostname"), (50, "topology.kubernetes.io/zone")])


def case_replicas_3_budget_2(c, docs, ns, release):
    pdbs = of_kind(docs, "PodDisruptionBudget")
    c.eq("PDB maxUnavailable", [p["spec"].get("maxUnavailable") for p in pdbs], [2])
    c.eq("replicas", deployment(docs)["spec"]["replicas"], 3)


def case_replicas_2_budget_off(c, docs, ns, release):
    c.eq("replicas", deployment(docs)["spec"]["replicas"], 2)
    c.eq("no PodDisruptionBudget", len(of_kind(docs, "PodDisruptionBudget")), 0)


def case_no_leader_election(c, docs, ns, release):
    c.eq("strategy Recreate (never two unelected operators)",
         deployment(docs)["spec"].get("strategy"), {"type": "Recreate"})
    c.true("no --leader-election", not any(a.startswith("--leader-election") for a in args(docs)), args(docs))
    c.true("no leader Role", named(docs, "Role", f"{release}-operator-leader") is None)
    c.true("no leader RoleBinding", named(docs, "RoleBinding", f"{release}-operator-leader") is None)


def case_cluster_wide(c, docs, ns, release):
    full = f"{release}-operator"
    crb = named(docs, "ClusterRoleBinding", full)
    c.true("a ClusterRoleBinding of the operator's rules", crb is not None)
    if crb:
        c.eq("it binds the ClusterRole", crb["roleRef"],
             {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": full})
        c.eq("to the operator's ServiceAccount", crb["subjects"],
             [{"kind": "ServiceAccount", "name": full, "namespace": ns["release"]}])
    c.eq("no RoleBinding of the operator's rules", rolebindings_named(docs, full), [])
    c.true("no --watch-namespace (all namespaces)",
           not any(a.startswith("--watch-namespace") for a in args(docs)), args(docs))
    check_operator_rbac(c, docs, release)


def case_watch_namespaces(c, docs, ns, release):
    c.eq("RoleBindings of the operator's rules: one per watched namespace",
         rolebindings_named(docs, f"{release}-operator"), sorted([ns["a"], ns["b"]]))
    c.true("--watch-namespace lists them", f"--watch-namespace={ns['a']},{ns['b']}" in args(docs), args(docs))
    c.true("no ClusterRoleBinding of the operator's rules",
           named(docs, "ClusterRoleBinding", f"{release}-operator") is None)


def case_monitoring(c, docs, ns, release):
    boards = [d for d in of_kind(docs, "ConfigMap")
              if d["metadata"].get("labels", {}).get("grafana_dashboard") == "1"]
    c.eq("dashboard ConfigMaps in the dashboards namespace",
         sorted((d["metadata"]["name"], d["metadata"]["namespace"]) for d in boards),
         sorted((f"{release}-operator-dashboard-{n}", ns["mon"]) for n in ("node", "operator", "overview")))
    rules = of_kind(docs, "PrometheusRule")
    c.eq("one PrometheusRule with the release label", [r["metadata"]["labels"].get("release") for r in rules],
         ["kube-prometheus-stack"])
    monitors = of_kind(docs, "ServiceMonitor")
    c.eq("one ServiceMonitor", len(monitors), 1)
    if monitors:
        c.eq("it selects the metrics Service", monitors[0]["spec"]["selector"]["matchLabels"],
             {**selector(release), "app.kubernetes.io/component": "metrics"})
        c.eq("its interval", monitors[0]["spec"]["endpoints"][0]["interval"], "15s")


def values_cache_clusters(ns):
    return {
        "watchNamespaces": [ns["release"], ns["a"]],
        "cacheClusters": [
            {"name": "results", "spec": example_spec("cachecluster-minimal.yaml")},
            {"name": "analytics", "namespace": ns["a"], "labels": {"team": "data"},
             "annotations": {"helm.sh/resource-policy": "keep"},
             "spec": example_spec("cachecluster-full.yaml")},
        ],
    }


def case_cache_clusters(c, docs, ns, release):
    got = of_kind(docs, "CacheCluster")
    c.eq("two CacheClusters", sorted((d["metadata"]["namespace"], d["metadata"]["name"]) for d in got),
         sorted([(ns["release"], "results"), (ns["a"], "analytics")]))
    c.eq("apiVersion", sorted({d["apiVersion"] for d in got}), ["flightcache.dev/v1alpha1"])
    for want in values_cache_clusters(ns)["cacheClusters"]:
        doc = named(docs, "CacheCluster", want["name"])
        if doc is None:
            continue
        c.eq(f"{want['name']}: spec as given", doc["spec"], want["spec"])
        c.eq(f"{want['name']}: labels", doc["metadata"]["labels"],
             {**want.get("labels", {}), "app.kubernetes.io/managed-by": "Helm",
              "helm.sh/chart": f"flightcache-{CHART_VERSION}"})
        c.eq(f"{want['name']}: annotations", doc["metadata"].get("annotations"), want.get("annotations"))


def case_pod_extras(c, docs, ns, release):
    dep = deployment(docs)
    meta = dep["spec"]["template"]["metadata"]
    spec = pod_spec(docs)
    c.eq("imagePullSecrets", spec.get("imagePullSecrets"), [{"name": "regcred"}, {"name": "mirror"}])
    c.eq("priorityClassName", spec.get("priorityClassName"), "flightcache-critical")
    c.eq("pod annotations", meta.get("annotations"), {"example.com/owner": "platform", "sidecar.istio.io/inject": "false"})
    c.eq("pod labels: the extra ones and the selector", meta["labels"],
         {"team": "platform", "example.com/tier": "control", **selector(release)})
    c.eq("the selector is unchanged", dep["spec"]["selector"]["matchLabels"], selector(release))
    c.true("no pull secrets on the ServiceAccount (the pod carries them)",
           "imagePullSecrets" not in of_kind(docs, "ServiceAccount")[0])


def values_network_policy(ns):
    return {
        "watchNamespaces": [ns["a"], ns["b"]],
        "metricsPort": 9100,
        "networkPolicy": {
            "enabled": True,
            "ingress": {"metricsFrom": [
                {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns["mon"]}},
                 "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]},
            "egress": {
                "apiServer": {"ports": [6443], "to": [{"ipBlock": {"cidr": "10.0.0.10/32"}}]},
                "dns": {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                                "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}]},
                "extra": [{"to": [{"ipBlock": {"cidr": "10.1.2.3/32"}}], "ports": [{"protocol": "TCP", "port": 3128}]}],
            },
        },
        "cacheClusters": [{"name": "results", "namespace": ns["a"],
                           "spec": {"port": 6000, "pools": [{"name": "default"}]}}],
    }


def network_policy(c, docs, release, ns):
    pols = of_kind(docs, "NetworkPolicy")
    c.eq("one NetworkPolicy", [(p["metadata"]["name"], p["metadata"]["namespace"]) for p in pols],
         [(f"{release}-operator", ns["release"])])
    return pols[0]["spec"] if pols else None


def case_network_policy(c, docs, ns, release):
    spec = network_policy(c, docs, release, ns)
    if spec is None:
        return
    v = values_network_policy(ns)["networkPolicy"]
    c.eq("selects the operator's pods", spec["podSelector"], {"matchLabels": selector(release)})
    c.eq("policy types", spec["policyTypes"], ["Ingress", "Egress"])
    c.eq("ingress: the metrics port from the given peers", spec["ingress"],
         [{"ports": [{"protocol": "TCP", "port": 9100}], "from": v["ingress"]["metricsFrom"]}])
    c.eq("the container's metrics port", pod_spec(docs)["containers"][0]["ports"],
         [{"name": "metrics", "containerPort": 9100}])
    c.eq("egress", spec["egress"], [
        {"ports": [{"protocol": "TCP", "port": 6443}], "to": v["egress"]["apiServer"]["to"]},
        {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}], "to": v["egress"]["dns"]["to"]},
        {"ports": [{"protocol": "TCP", "port": 50051}, {"protocol": "TCP", "port": 6000}],
         "to": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "flightcache-node"}},
                 "namespaceSelector": {"matchExpressions": [
                     {"key": "kubernetes.io/metadata.name", "operator": "In", "values": [ns["a"], ns["b"]]}]}}]},
        v["egress"]["extra"][0],
    ])


def case_network_policy_cluster_wide(c, docs, ns, release):
    spec = network_policy(c, docs, release, ns)
    if spec is None:
        return
    c.eq("ingress: the metrics port from anywhere", spec["ingress"], [{"ports": [{"protocol": "TCP", "port": 8080}]}])
    c.eq("egress: the API server's ports to any address, no DNS, the nodes of every namespace", spec["egress"], [
        {"ports": [{"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 6443}]},
        {"ports": [{"protocol": "TCP", "port": 50051}],
         "to": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "flightcache-node"}},
                 "namespaceSelector": {}}]},
    ])


def cases(ns):
    """(name, values, extra helm args, check function), every documented combination."""
    return [
        ("defaults", {}, [], case_defaults),
        ("replicas 2", {"replicas": 2}, [], case_replicas_2),
        ("replicas 3, budget 2", {"replicas": 3, "podDisruptionBudget": {"maxUnavailable": 2}}, [],
         case_replicas_3_budget_2),
        ("replicas 2, budget off", {"replicas": 2, "podDisruptionBudget": {"enabled": False}}, [],
         case_replicas_2_budget_off),
        ("leader election off", {"leaderElection": False}, [], case_no_leader_election),
        ("clusterWide", {"clusterWide": True}, [], case_cluster_wide),
        ("secretWritePolicy off", {"secretWritePolicy": False}, [],
         lambda c, docs, ns, release: c.eq(
             "no admission policy",
             [d["kind"] for d in docs if d["kind"].startswith("ValidatingAdmissionPolicy")], [])),
        ("watchNamespaces a,b", {"watchNamespaces": [ns["a"], ns["b"]]}, [], case_watch_namespaces),
        ("monitoring on", {"monitoring": {
            "dashboards": {"enabled": True, "namespace": ns["mon"]},
            "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
            "serviceMonitor": {"enabled": True, "interval": "15s"}}},
         ["--api-versions", "monitoring.coreos.com/v1"], case_monitoring),
        ("two cacheClusters (docs/examples)", values_cache_clusters(ns), [], case_cache_clusters),
        ("pull secrets, pod annotations and labels, priority class", {
            "imagePullSecrets": [{"name": "regcred"}, {"name": "mirror"}],
            "podAnnotations": {"example.com/owner": "platform", "sidecar.istio.io/inject": "false"},
            "podLabels": {"team": "platform", "example.com/tier": "control"},
            "priorityClassName": "flightcache-critical"}, [], case_pod_extras),
        ("networkPolicy on, namespaced", values_network_policy(ns), [], case_network_policy),
        ("networkPolicy on, clusterWide, no DNS", {
            "clusterWide": True, "networkPolicy": {"enabled": True, "egress": {"dns": {"enabled": False}}}},
         [], case_network_policy_cluster_wide),
    ]


def reused_values_chart(workdir):
    """This chart with the previous release's values.yaml in place of its own: what
    `helm upgrade --reuse-values` renders (helm keeps the installed chart's values, so a
    value added since has no default). Returns the copy's path."""
    copy = os.path.join(workdir, "reused-values-chart")
    shutil.copytree(CHART, copy, ignore=shutil.ignore_patterns("tests"))
    with tarfile.open(PREVIOUS_CHART) as tar:
        member = tar.extractfile("flightcache/values.yaml")
        previous = member.read() if member else b""
    with open(os.path.join(copy, "values.yaml"), "wb") as fh:
        fh.write(previous)
    return copy


def case_reused_values(c, docs, ns, release):
    given = [a for a in args(docs) if a.startswith("--")]
    empty = [a for a in given if a.endswith("=")]
    c.true("every operator flag has a value (none rendered from a value the release lacks)",
           not empty, empty)
    c.true("no --issued-certificate-lifetime: the operator's default holds",
           not any(a.startswith("--issued-certificate-lifetime") for a in given), given)
    c.true("clusterWide kept: no --watch-namespace",
           not any(a.startswith("--watch-namespace") for a in given), given)
    c.eq("image tag set on upgrade", pod_spec(docs)["containers"][0]["image"], "flightcache/operator:next")
    c.eq("no PodDisruptionBudget with one replica", len(of_kind(docs, "PodDisruptionBudget")), 0)
    c.eq("no NetworkPolicy", len(of_kind(docs, "NetworkPolicy")), 0)
    c.true("the Secret write policy, though 0.1.0's values lack secretWritePolicy",
           named(docs, "ValidatingAdmissionPolicy", f"{release}-operator-secret-writes") is not None)


def reused_values_cases(ns):
    """(name, values, extra, check) rendered with reused_values_chart: the values
    e2e/tests/chart-upgrade installs 0.1.0 with and sets on upgrade."""
    return [
        ("helm upgrade --reuse-values from 0.1.0 (clusterWide, dashboards)", {
            "clusterWide": True, "monitoring": {"dashboards": {"enabled": True}},
            "image": {"tag": "next"}}, [], case_reused_values),
        ("helm upgrade --reuse-values from 0.1.0, replicas 2", {
            "clusterWide": True, "replicas": 2, "image": {"tag": "next"}}, [],
         lambda c, docs, ns, release: c.eq(
             "a PodDisruptionBudget of maxUnavailable 1 (a default the release lacked)",
             [p["spec"]["maxUnavailable"] for p in of_kind(docs, "PodDisruptionBudget")], [1])),
    ]


def invalid_renderings(ns):
    """Values the values schema accepts but the API schemas refuse: kubeconform must fail
    them, which proves it validates against the CRD and Kubernetes schemas at all.
    (name, values, kind kubeconform must refuse)."""
    return [
        ("a pool field the CRD does not have", {
            "cacheClusters": [{"name": "typo", "spec": {"pools": [{"name": "default", "shardz": 3}]}}]},
         "CacheCluster"),
        ("a pool field of the wrong type", {
            "cacheClusters": [{"name": "typo", "spec": {"pools": [{"name": "default", "shards": "three"}]}}]},
         "CacheCluster"),
        ("an affinity the pod schema does not have", {
            "affinity": {"nodeAffinity": {"requiredDuringScheduling": {}}}}, "Deployment"),
    ]


def refusals(ns):
    """(name, values, a substring of the message helm must fail with)."""
    one = [{"name": "results", "spec": {"pools": [{"name": "default"}]}}]
    return [
        ("a misspelt top-level key", {"replica": 2}, "additional properties 'replica' not allowed"),
        ("a misspelt nested key", {"networkPolicy": {"enable": True}},
         "at '/networkPolicy': additional properties 'enable' not allowed"),
        ("replicas 0", {"replicas": 0}, "at '/replicas': minimum: got 0, want 1"),
        ("replicas 4", {"replicas": 4}, "at '/replicas': maximum: got 4, want 3"),
        ("replicas as a string", {"replicas": "2"}, "at '/replicas': got string, want integer"),
        ("replicas 2 without leader election", {"replicas": 2, "leaderElection": False},
         "replicas is 2 but leaderElection is false"),
        ("an unknown log format", {"logFormat": "yaml"}, "at '/logFormat': value must be one of 'json', 'text'"),
        ("a pull secret as a bare string", {"imagePullSecrets": ["regcred"]},
         "at '/imagePullSecrets/0': got string, want object"),
        ("a pod label taking the selector's key", {"podLabels": {"app.kubernetes.io/name": "other"}},
         "at '/podLabels'"),
        ("a pod label value with a space", {"podLabels": {"team": "data team"}}, "at '/podLabels/team'"),
        ("a priority class in capitals", {"priorityClassName": "Critical"}, "at '/priorityClassName'"),
        ("a budget of 0", {"replicas": 2, "podDisruptionBudget": {"maxUnavailable": 0}},
         "at '/podDisruptionBudget/maxUnavailable': minimum: got 0, want 1"),
        ("a node port out of range", {"networkPolicy": {"egress": {"cacheNodePorts": [70000]}}},
         "at '/networkPolicy/egress/cacheNodePorts/0': maximum"),
        ("a NetworkPolicy peer misspelt", {"networkPolicy": {"ingress": {"metricsFrom": [{"podselector": {}}]}}},
         "additional properties 'podselector' not allowed"),
        ("a toleration effect unknown", {"tolerations": [{"key": "k", "effect": "NoExec"}]},
         "at '/tolerations/0/effect': value must be one of"),
        ("a CacheCluster without spec", {"cacheClusters": [{"name": "results"}]},
         "at '/cacheClusters/0': missing property 'spec'"),
        ("a CacheCluster without pools", {"cacheClusters": [{"name": "results", "spec": {"port": 50051}}]},
         "at '/cacheClusters/0/spec': missing property 'pools'"),
        ("a CacheCluster name in capitals", {"cacheClusters": [{"name": "Results", "spec": {"pools": [{"name": "a"}]}}]},
         "at '/cacheClusters/0/name'"),
        ("a CacheCluster field misspelt", {"cacheClusters": [{"name": "r", "namespce": "x", "spec": {"pools": [{"name": "a"}]}}]},
         "additional properties 'namespce' not allowed"),
        ("a CacheCluster in a namespace not watched",
         {"cacheClusters": [{**one[0], "namespace": ns["b"]}], "watchNamespaces": [ns["a"]]},
         f"is in namespace {ns['b']}, which the operator does not watch"),
        ("a CacheCluster listed twice", {"cacheClusters": one + one},
         f"CacheCluster {ns['release']}/results is listed twice"),
    ]


def report(results):
    """Prints each failed check with its detail (and, with CHART_TESTS_VERBOSE, the passed
    ones), then the totals line; returns the failed (what, ok, detail) records."""
    failed = [r for r in results if not r[1]]
    for what, _ok, detail in failed:
        print(f"FAIL {what}")
        if detail:
            print("     " + str(detail).replace("\n", "\n     "))
    if os.environ.get("CHART_TESTS_VERBOSE"):
        for what, ok, _ in results:
            if ok:
                print(f"ok   {what}")
    print(f"chart-tests: {len(results) - len(failed)} passed, {len(failed)} failed")
    return failed
