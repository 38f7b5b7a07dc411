# shellcheck shell=bash
# The interop tests' steps, sourced by e2e/interop/steps (any endpoint) and
# e2e/interop/check (a local node): the three clients behind one function, the pass/fail
# record, and the cross-client matrix. No Kubernetes here, and nothing that needs the
# network once build_clients has run (the clients' builds are cached).

INTEROP=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$INTEROP/../.." && pwd)
VENV=${VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/flightcache/venv}
CLIENTS=(pyarrow java go)
# Each client process is bounded: a call's own deadline is 20 s (the clients'), a JVM
# starts in 2-4 s.
CLIENT_TIMEOUT_S=60
PASSED=0
FAILED=0

pass() { PASSED=$((PASSED + 1)); echo "PASS $*"; }
fail() { FAILED=$((FAILED + 1)); echo "FAIL $*"; }

# Prints the totals; returns non-zero when a check failed.
summary() {
  echo "interop: $PASSED passed, $FAILED failed"
  ((FAILED == 0))
}

# Makes the pyarrow virtualenv and builds (or finds) the Java and Go clients. Needs the
# package registries the first time; afterwards everything runs offline.
build_clients() {
  "$ROOT/scripts/python-env" "$VENV"
  "$INTEROP/java/run" --build >/dev/null
  "$INTEROP/go/run" --build >/dev/null
}

# client NAME put|get HOST PORT TOKEN KEY FILE: one call by one client, TLS from the
# FLIGHTCACHE_TLS_* variables. Output and exit code as the client's own.
client() {
  local name=$1
  shift
  case $name in
    pyarrow) timeout "$CLIENT_TIMEOUT_S" "$VENV/bin/python" "$INTEROP/pyarrow_client.py" "$@" ;;
    java) timeout "$CLIENT_TIMEOUT_S" "$INTEROP/java/run" "$@" ;;
    go) timeout "$CLIENT_TIMEOUT_S" "$INTEROP/go/run" "$@" ;;
    *) echo "unknown client $name" >&2; return 2 ;;
  esac
}

# expect_answer LABEL WANT NAME VERB ARGS...: the client must exit 0 printing WANT.
expect_answer() {
  local label=$1 want=$2 out err
  shift 2
  err=$(mktemp)
  if out=$(client "$@" 2>"$err"); then
    if [[ $out == "$want" ]]; then
      rm -f "$err"
      return 0
    fi
    fail "$label: printed '$out', expected '$want' $(head -c 400 "$err")"
  else
    fail "$label: exit $? $(head -c 400 "$err")"
  fi
  rm -f "$err"
  return 1
}

# expect_refused LABEL CODE NAME VERB ARGS...: the client must exit 1 naming the gRPC
# status CODE on stderr.
expect_refused() {
  local label=$1 code=$2 status=0 err
  shift 2
  err=$(mktemp)
  client "$@" >/dev/null 2>"$err" || status=$?
  if ((status == 1)) && grep -q ": $code: " "$err"; then
    pass "$label: exit 1, $(head -n 1 "$err")"
  else
    fail "$label: exit $status, expected 1 with $code: $(head -c 400 "$err")"
  fi
  rm -f "$err"
}

# compare_files LABEL EXPECTED GOT: pyarrow reads both IPC files; equal tables and schemas.
compare_files() {
  local label=$1 out
  if out=$("$VENV/bin/python" "$INTEROP/pyarrow_client.py" compare "$2" "$3" 2>&1); then
    pass "$label: $out"
  else
    fail "$label: $out"
  fi
}

# interop_steps HOST PORT TOKEN WORKDIR: the cross-client matrix against one endpoint (a
# node, or a pool's Service). pyarrow writes two tables as Arrow IPC files (`mixed`: 1,000
# rows of nine column types with nulls, non-ASCII strings and metadata, in three batches;
# `empty`: a schema and no rows); each client puts each table under its own key; each
# client reads every key back, and pyarrow compares what it wrote with what was read.
# Then a wrong token is refused with UNAUTHENTICATED (get and put) and a key never put
# reads as missing, for each client. Keys live under interop/<run id>/ and carry a
# non-ASCII segment, so every client must send the same UTF-8 bytes. TOKEN "-": the
# endpoint has no auth (the wrong-token checks are skipped).
interop_steps() {
  local host=$1 port=$2 token=$3 work=$4
  local run_id prefix kind writer reader key rows got
  run_id="$(date +%Y%m%d-%H%M%S)-$$-$RANDOM"
  prefix="interop/$run_id"
  mkdir -p "$work"
  local tls="plaintext"
  if [[ -n ${FLIGHTCACHE_TLS_CA:-} ]]; then
    tls="TLS, CA $FLIGHTCACHE_TLS_CA${FLIGHTCACHE_TLS_CLIENT_CERT:+, client certificate $FLIGHTCACHE_TLS_CLIENT_CERT}"
  fi
  echo "interop: $host:$port ($tls), keys under $prefix/"
  for kind in mixed empty; do
    "$VENV/bin/python" "$INTEROP/pyarrow_client.py" table "$kind" "$work/$kind.arrow"
    rows=0
    if [[ $kind == mixed ]]; then rows=1000; fi
    for writer in "${CLIENTS[@]}"; do
      key="$prefix/$kind/from-$writer/zürich"
      if expect_answer "$writer puts $kind" "{\"ok\":true,\"rows\":$rows}" \
        "$writer" put "$host" "$port" "$token" "$key" "$work/$kind.arrow"; then
        pass "$writer puts $kind ($rows rows)"
      fi
    done
    for writer in "${CLIENTS[@]}"; do
      key="$prefix/$kind/from-$writer/zürich"
      for reader in "${CLIENTS[@]}"; do
        got="$work/$kind-from-$writer-read-by-$reader.arrow"
        if expect_answer "$reader reads $writer's $kind" "{\"ok\":true,\"rows\":$rows}" \
          "$reader" get "$host" "$port" "$token" "$key" "$got"; then
          compare_files "$reader reads $writer's $kind" "$work/$kind.arrow" "$got"
        fi
      done
    done
  done
  for reader in "${CLIENTS[@]}"; do
    if [[ $token == - ]]; then
      echo "SKIP $reader with a wrong token: the endpoint has no auth"
    else
      expect_refused "$reader gets with a wrong token" UNAUTHENTICATED \
        "$reader" get "$host" "$port" "wrong-$token" "$prefix/mixed/from-pyarrow/zürich" "$work/refused.arrow"
      expect_refused "$reader puts with a wrong token" UNAUTHENTICATED \
        "$reader" put "$host" "$port" "wrong-$token" "$prefix/refused/$reader" "$work/mixed.arrow"
    fi
    if expect_answer "$reader gets a key never put" '{"ok":false,"missing":true}' \
      "$reader" get "$host" "$port" "$token" "$prefix/never-put" "$work/missing.arrow"; then
      pass "$reader gets a key never put: missing"
    fi
  done
}

# client_cert_steps HOST PORT TOKEN WORKDIR: against an endpoint that requires client
# certificates (tlsClientAuth required), with FLIGHTCACHE_TLS_CA, _CLIENT_CERT and
# _CLIENT_KEY set: each client puts and reads back a key presenting that certificate, then
# reads it again with the same key in the traditional PEM encoding (PKCS#1 / SEC 1,
# "BEGIN EC PRIVATE KEY": cert-manager's default), which the Java wrapper converts for
# Netty.
client_cert_steps() {
  local host=$1 port=$2 token=$3 work=$4 name key traditional
  mkdir -p "$work"
  "$VENV/bin/python" "$INTEROP/pyarrow_client.py" table mixed "$work/mixed.arrow"
  traditional="$work/client-traditional.key"
  openssl pkey -in "$FLIGHTCACHE_TLS_CLIENT_KEY" -traditional -out "$traditional"
  echo "interop: $host:$port requires a client certificate; key encodings: $(head -n 1 "$FLIGHTCACHE_TLS_CLIENT_KEY") and $(head -n 1 "$traditional")"
  for name in "${CLIENTS[@]}"; do
    key="interop/client-cert/$$-$RANDOM/$name"
    if expect_answer "$name puts with a client certificate" '{"ok":true,"rows":1000}' \
      "$name" put "$host" "$port" "$token" "$key" "$work/mixed.arrow" \
      && expect_answer "$name gets with a client certificate" '{"ok":true,"rows":1000}' \
        "$name" get "$host" "$port" "$token" "$key" "$work/cert-$name.arrow"; then
      compare_files "$name puts and gets with a client certificate (PKCS#8 key)" "$work/mixed.arrow" "$work/cert-$name.arrow"
    fi
    if FLIGHTCACHE_TLS_CLIENT_KEY=$traditional expect_answer "$name gets with a traditional PEM key" \
      '{"ok":true,"rows":1000}' "$name" get "$host" "$port" "$token" "$key" "$work/cert-trad-$name.arrow"; then
      compare_files "$name gets with a client certificate (traditional PEM key)" "$work/mixed.arrow" "$work/cert-trad-$name.arrow"
    fi
  done
}
