# shellcheck shell=bash
# Local flightcache-node processes for e2e/interop/check and e2e/interop/frozen-node:
# built once with cargo (or FLIGHTCACHE_NODE_BIN), started on loopback, and stopped by
# PID. Needs lib.sh sourced first (ROOT, VENV).

NODE_PIDS=()

# Prints the node binary's path, building it (debug) when FLIGHTCACHE_NODE_BIN is unset.
node_binary() {
  if [[ -n ${FLIGHTCACHE_NODE_BIN:-} ]]; then
    echo "$FLIGHTCACHE_NODE_BIN"
    return
  fi
  local target=${CARGO_TARGET_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/flightcache/target}
  (cd "$ROOT" && CARGO_TARGET_DIR=$target cargo build -q -p cache-node --bin flightcache-node) >&2
  echo "$target/debug/flightcache-node"
}

free_port() {
  "$VENV/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# start_node BIN LOG FLAGS...: starts a node on 127.0.0.1 (a free port, metrics on
# another) and waits until it accepts TCP connections, at most 30 s. Sets NODE_PORT and
# NODE_PID, and remembers the PID for stop_nodes.
start_node() {
  local bin=$1 log=$2 waited=0
  shift 2
  NODE_PORT=$(free_port)
  "$bin" --listen "127.0.0.1:$NODE_PORT" --metrics-listen "127.0.0.1:$(free_port)" \
    --shutdown-grace 1s "$@" >"$log" 2>&1 &
  NODE_PID=$!
  NODE_PIDS+=("$NODE_PID")
  until (exec 3<>"/dev/tcp/127.0.0.1/$NODE_PORT") 2>/dev/null; do
    if ! kill -0 "$NODE_PID" 2>/dev/null; then
      echo "the node exited before it listened; its log:" >&2
      cat "$log" >&2
      return 1
    fi
    if ((waited >= 300)); then
      echo "the node did not listen on 127.0.0.1:$NODE_PORT within 30 s" >&2
      return 1
    fi
    sleep 0.1
    waited=$((waited + 1))
  done
}

# Stops every node started here, by PID: SIGCONT first (a node stopped by a test must be
# able to take its SIGTERM), SIGTERM, SIGKILL after 10 s.
stop_nodes() {
  local pid i status
  for pid in "${NODE_PIDS[@]}"; do
    if ! kill -CONT "$pid" 2>/dev/null || ! kill -TERM "$pid" 2>/dev/null; then
      continue # exited already
    fi
    for ((i = 0; i < 100; i++)); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
      echo "node $pid did not stop within 10 s of SIGTERM: SIGKILL" >&2
      kill -KILL "$pid"
    fi
    status=0
    wait "$pid" 2>/dev/null || status=$?
    if ((status != 0 && status != 143)); then # 143: ended by the SIGTERM
      echo "node $pid exited with status $status on its SIGTERM" >&2
    fi
  done
  NODE_PIDS=()
}
