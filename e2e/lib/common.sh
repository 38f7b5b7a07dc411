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

# Debian packages the cluster needs (installed by `cluster up`, never removed).
APT_PACKAGES=(containerd runc containernetworking-plugins iptables conntrack openssl curl jq iproute2 util-linux)

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
