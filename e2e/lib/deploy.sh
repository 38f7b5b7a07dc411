# Deploying FlightCache onto the e2e cluster (sourced after common.sh, not run):
# optimised binaries -> images in the cluster's containerd -> CRD -> operator via the chart.
# shellcheck shell=bash

ROOT=${ROOT:-$(cd "$E2E/.." && pwd)}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/flightcache/target}
# The operator's namespace and Helm release: scripts/test gives each of the suites it runs
# side by side its own (the release names the chart's cluster-scoped RBAC, so two
# releases need two names).
SYSTEM_NS=${SYSTEM_NS:-flightcache-system}
RELEASE=${FLIGHTCACHE_RELEASE:-flightcache}
OPERATOR_DEPLOY=$RELEASE-operator
NODE_IMAGE=flightcache/node:e2e
# The tests build with the `e2e` profile (the release profile without cross-crate LTO, so a
# fresh clone over a warm cache rebuilds the workspace crates in about a third of the time);
# scripts/demo builds `release`, what ships.
BUILD_PROFILE=${FLIGHTCACHE_BUILD_PROFILE:-e2e}
BIN_DIR=$CARGO_TARGET_DIR/$BUILD_PROFILE
OPERATOR_IMAGE=flightcache/operator:e2e

# build_and_import_images: $BUILD_PROFILE builds of the node, the operator and the load generator,
# the node and the operator imported as $NODE_IMAGE and $OPERATOR_IMAGE (no registry; pods
# use imagePullPolicy Never). One cargo invocation for all three: building a package alone
# unifies the dependencies' features differently and compiles them all a second time.
build_and_import_images() {
  # scripts/test builds and imports once before it runs suites side by side.
  [[ -z ${FLIGHTCACHE_E2E_IMAGES_READY:-} ]] || return 0
  local rc=0
  cargo build --profile "$BUILD_PROFILE" --quiet -p cache-node --bin flightcache-node --bin flightcache-load -p operator --bin flightcache-operator || rc=$?
  # For the next fresh clone, whatever the outcome: these sources built this (scripts/source-mtimes).
  (cd "$ROOT" && scripts/source-mtimes save "$CARGO_TARGET_DIR" >/dev/null)
  ((rc == 0)) || return "$rc"
  "$E2E/images" import "$NODE_IMAGE" "$BIN_DIR/flightcache-node" >/dev/null
  "$E2E/images" import "$OPERATOR_IMAGE" "$BIN_DIR/flightcache-operator" >/dev/null
}

# install_operator [HELM ARG...]: the CRD, then the chart (operator Deployment, RBAC) in
# $SYSTEM_NS with the extra helm arguments (e.g. --set monitoring...); waits for the
# Deployment to be available. With OPERATOR_ON_HOME_NODE set (scripts/test, for the suites it
# runs beside the node-level faults of e2e/tests/multi-node and persistence, which take
# nodes 2 and 3 only) the operator runs on node 1.
install_operator() {
  local pin=()
  [[ -z ${OPERATOR_ON_HOME_NODE:-} ]] || pin=(--set-string "nodeSelector.kubernetes\.io/hostname=$(home_node)")
  # The shipped CRD, taking over the fields an earlier test applied from the generator in
  # process (operator/tests/api_server.rs, field manager flightcache-tests): without
  # --force-conflicts the apply failed and the tests ran against that test's copy.
  kctl apply --server-side --force-conflicts -f "$ROOT/charts/flightcache/crds/" >/dev/null
  wait_condition 60 crd/cacheclusters.flightcache.dev Established || return 1
  kctl create namespace "$SYSTEM_NS" --dry-run=client -o yaml | kctl apply -f - >/dev/null
  "$ROOT/scripts/helm" upgrade --install "$RELEASE" "$ROOT/charts/flightcache" -n "$SYSTEM_NS" \
    --kubeconfig "$KUBECONFIG_FILE" --skip-crds \
    --set "image.repository=${OPERATOR_IMAGE%:*},image.tag=${OPERATOR_IMAGE#*:},image.pullPolicy=Never" \
    --set "nodeImage.repository=${NODE_IMAGE%:*},nodeImage.tag=${NODE_IMAGE#*:},nodeImage.pullPolicy=Never" "${pin[@]}" "$@" >/dev/null
  kctl -n "$SYSTEM_NS" rollout status "deploy/$OPERATOR_DEPLOY" --timeout=120s >/dev/null
}

# uninstall_operator: removes the chart's release (the CRD stays, as with helm), first
# keeping every operator replica's whole log in $STATE/logs/operator-$SUITE.log: a CI
# failure prints only its tail, and the passes before it are what explain it.
uninstall_operator() {
  kctl -n "$SYSTEM_NS" logs -l app.kubernetes.io/name=flightcache-operator --tail=-1 \
    --prefix --max-log-requests 4 >"$STATE/logs/operator-${SUITE:-e2e}.log" 2>&1 || true
  "$ROOT/scripts/helm" uninstall "$RELEASE" -n "$SYSTEM_NS" --kubeconfig "$KUBECONFIG_FILE" >/dev/null 2>&1 || true
}

# trust_cluster_ca NS CLUSTER [SECONDS]: the TLS every CacheCluster serves by default. Waits
# (SECONDS, default 60) until status.caSecret names the Secret with the CA of the certificate
# the operator issued, writes its ca.crt to $STATE/ca/NS-CLUSTER.crt and exports its path as
# FLIGHTCACHE_TLS_CA (pyarrow: flight_client.py, pyarrow_load.py and the admin scripts) and
# FLIGHTCACHE_LOAD_TLS_CA (flightcache-load): the clients the suite starts from then on dial
# grpc+tls:// and trust it (`e2e/cluster exec-client` keeps the environment).
trust_cluster_ca() {
  local ns=$1 cluster=$2 limit=${3:-60} secret="" path
  local deadline=$((SECONDS + limit))
  until secret=$(kctl -n "$ns" get cachecluster "$cluster" -o jsonpath='{.status.caSecret}' 2>/dev/null) &&
    [[ -n $secret ]] && kctl -n "$ns" get secret "$secret" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || return 1
    sleep 0.2
  done
  mkdir -p "$STATE/ca"
  path=$STATE/ca/$ns-$cluster.crt
  kctl -n "$ns" get secret "$secret" -o jsonpath='{.data.ca\.crt}' | base64 -d >"$path"
  grep -q "BEGIN CERTIFICATE" "$path" || return 1
  export FLIGHTCACHE_TLS_CA=$path FLIGHTCACHE_LOAD_TLS_CA=$path
}
