# Shared settings and helpers of the e2e cluster scripts (sourced, not run).
# shellcheck disable=SC2034 # the settings are used by the scripts that source this file
# shellcheck shell=bash

E2E=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
STATE=${FLIGHTCACHE_E2E_STATE:-$E2E/.cluster}

# Network layout. Everything lives on a bridge the harness creates; no default route for pods.
BRIDGE=flightcache0
POD_CIDR=10.244.0.0/24
GATEWAY=10.244.0.1            # the bridge address: CoreDNS and the in-cluster apiserver endpoint
SVC_CIDR=10.96.0.0/24
KUBE_SVC_IP=10.96.0.1         # ClusterIP of the `kubernetes` Service
CLUSTER_DOMAIN=cluster.local
CLIENT_NS=flightcache-client  # host-side client network namespace
CLIENT_IP=10.244.0.254        # outside the pods' IPAM range (.2-.239)
CLIENT_VETH=fcclient0
GUARD_CHAIN=FLIGHTCACHE-GUARD # egress guard (FORWARD + OUTPUT)
INPUT_CHAIN=FLIGHTCACHE-INPUT # ingress guard (INPUT, IPv4 and IPv6)

# Images the harness makes itself (never pulled: every registry points at a dead loopback port).
PAUSE_IMAGE=flightcache.local/pause:e2e
PROBE_IMAGE=flightcache.local/probe:e2e
RESOLVE_IMAGE=flightcache.local/resolve:e2e

CONTAINERD_SOCK=$STATE/containerd/containerd.sock
KUBECONFIG_FILE=$STATE/kubeconfig
# kubectl's discovery cache is keyed by the API server's address only (~/.kube/cache/
# discovery/127.0.0.1_6443), so a cluster of an earlier run at the same address would
# answer for this one (a resource it had and this one lacks yet); each cluster has its own.
export KUBECACHEDIR=$STATE/kube-cache

# More Kubernetes nodes (`e2e/cluster up --nodes N`): node 1 is this host (pods on $BRIDGE,
# $POD_CIDR); node K >= 2 is a network namespace `fc-node-K` with its own containerd,
# kubelet and kube-proxy, its own bridge and pod subnet 10.244.(K-1).0/24, reached from the
# host through $NODE_BRIDGE (10.243.0.K) and a route per pod subnet. Every node has a zone
# label: node K is in zone-<K-th letter>.
NODE_BRIDGE=fcnodes0
NODE_NET_GW=10.243.0.1        # the host on the node network: kubelets reach the apiserver here
CLUSTER_CIDR=10.244.0.0/16    # every node's pod subnet
MAX_NODES=8
ZONE_LABEL=topology.kubernetes.io/zone
# node_count: how many nodes the running cluster has (`up --nodes N`; 1 without a cluster).
node_count() { cat "$STATE/nodes" 2>/dev/null || echo 1; }
node_zone() { local letters=abcdefgh; echo "zone-${letters:$1-1:1}"; }
# home_node: node 1's name (the host's kubelet; the one node no node-level fault takes).
home_node() { kctl get nodes -l "$ZONE_LABEL=$(node_zone 1)" -o jsonpath='{.items[0].metadata.name}' 2>/dev/null; }
netns_node_name() { echo "fc-node-$1"; }   # node K >= 2: node name = its network namespace
netns_node_ip() { echo "10.243.0.$1"; }
netns_node_sock() { echo "$STATE/n$1/containerd.sock"; }
# node_socks: the containerd socket of every node (images are imported into each).
node_socks() {
  local k
  echo "$CONTAINERD_SOCK"
  for ((k = 2; k <= $(node_count); k++)); do netns_node_sock "$k"; done
}

# Debian packages the cluster needs (installed by `cluster up`, never removed).
APT_PACKAGES=(containerd runc containernetworking-plugins iptables ipset conntrack openssl curl jq iproute2 util-linux)

T_START=${T_START:-$(date +%s.%N)}
elapsed() { awk -v s="$T_START" -v n="$(date +%s.%N)" 'BEGIN { printf "%6.2fs", n - s }'; }
say() { printf '[%s] %s\n' "$(elapsed)" "$*"; }
warn() { printf '[%s] warning: %s\n' "$(elapsed)" "$*" >&2; }
die() { printf '[%s] error: %s\n' "$(elapsed)" "$*" >&2; exit 1; }

need_root() { [[ $(id -u) == 0 ]] || die "must run as root (it creates a bridge, iptables rules and mounts)"; }

kctl() { "$STATE/bin/kubectl" --kubeconfig "$KUBECONFIG_FILE" "$@"; }
# wait_condition SECONDS OBJECT TYPE [kubectl args...]: poll until OBJECT's condition TYPE
# is True. (`kubectl wait --for=condition` fails at once with "accessor error" when it reads
# the object before any condition is written.)
wait_condition() {
  local limit=$1 object=$2 type=$3; shift 3
  local deadline=$((SECONDS + limit))
  until [[ $(kctl get "$object" "$@" -o jsonpath="{.status.conditions[?(@.type==\"$type\")].status}" 2>/dev/null) == True ]]; do
    ((SECONDS < deadline)) || return 1
    sleep 0.2
  done
}
ctrd() { ctr --address "$CONTAINERD_SOCK" --namespace k8s.io "$@"; }
ctrd_at() { local sock=$1; shift; ctr --address "$sock" --namespace k8s.io "$@"; } # ctrd_at SOCK ARGS...

# ---- Test-suite helpers, shared by every e2e test script.
# A suite sets SUITE (the name on its last line, `SUITE: N passed, N failed`) and may define
# `on_failure` (what to print before a fatal failure: objects, events, logs).
PASSED=0
FAILED=0
POLL_INTERVAL=${POLL_INTERVAL:-0.5}
pass() { PASSED=$((PASSED + 1)); say "ok: $*"; }
# fail MESSAGE: a fatal failure; prints the suite's context and its summary line, exits 1.
fail() {
  printf '[%s] FAILED: %s\n' "$(elapsed)" "$*" >&2
  if declare -F on_failure >/dev/null; then on_failure >&2 || true; fi
  # The reason again on the last line: a CI log is often read from its tail, below the context.
  echo "${SUITE:-e2e}: $PASSED passed, $((FAILED + 1)) failed; fatal: $*"
  exit 1
}
# fail_check MESSAGE: a failed check the suite reports and carries on after (see `summary`).
fail_check() { FAILED=$((FAILED + 1)); printf '[%s] FAILED: %s\n' "$(elapsed)" "$*"; }
# summary: the suite's last line; returns 1 when a check failed.
summary() { echo "${SUITE:-e2e}: $PASSED passed, $FAILED failed"; ((FAILED == 0)); }
# poll SECONDS COMMAND...: runs COMMAND every POLL_INTERVAL seconds until it succeeds;
# returns 1 when SECONDS pass first.
poll() {
  local deadline=$((SECONDS + $1)); shift
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || return 1
    sleep "$POLL_INTERVAL"
  done
}
# exited PID: the child PID has ended (it stays a zombie until `wait`, which still answers
# `kill -0`, so: no such process, or state Z in /proc/PID/stat).
exited() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  stat=${stat##*) } # the fields after "(comm)": state first
  [[ ${stat:0:1} == Z ]]
}
# wait_for SECONDS DESCRIPTION COMMAND...: poll, and fail the suite on timeout.
wait_for() {
  local limit=$1 what=$2; shift 2
  poll "$limit" "$@" || fail "$what (not within ${limit}s)"
}
