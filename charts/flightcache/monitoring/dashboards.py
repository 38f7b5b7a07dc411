"""Generates FlightCache's Grafana dashboards with the Grafana Foundation SDK.

Writes overview.json, node.json and operator.json into the directory given as the only
argument (the chart keeps them in charts/flightcache/dashboards/; `check` regenerates them
into a temporary directory and fails on drift). Pure: no network, no clock.

Series and labels come from docs/metrics.md. Node series carry `namespace`, `pod`,
`cachecluster` and `pool` (added by the operator's ServiceMonitor); the operator's per-pool
series carry `namespace`, `cachecluster` and `pool` themselves. Every query must return data
in a healthy cluster under load, so error-only counters are paired with a zero of the same
shape (`X or 0 * total`): an honest "no errors" rather than an empty panel.
"""

import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import common as common_builder
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import prometheus
from grafana_foundation_sdk.builders import stat
from grafana_foundation_sdk.builders import statetimeline
from grafana_foundation_sdk.builders import timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as dash_model

DATASOURCE = dash_model.DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE = "$__rate_interval"

# Label matchers shared by the queries of one scope.
CLUSTER = 'namespace="$namespace", cachecluster="$cachecluster"'
POOLS = CLUSTER + ', pool=~"$pool"'
POD = POOLS + ', pod="$pod"'

RESULT_HIT = 'result="hit"'
OUTCOME_FORWARDED = 'outcome="forwarded_hit"'
# DoGet outcomes that answered with data (the "hit latency" of the SLO).
HIT_OUTCOMES = 'outcome=~"local_hit|forwarded_hit"'
# gRPC codes that are the server's fault (the availability SLO's bad events); NotFound is a
# miss and InvalidArgument, ResourceExhausted or Unimplemented are the client's: not counted.
SERVER_ERROR_CODES = 'grpc_code=~"Unknown|Internal|Unavailable|DataLoss|DeadlineExceeded"'


def m(name, matchers, extra=""):
    """A series selector: `name{matchers, extra}`."""
    inner = matchers if not extra else f"{matchers}, {extra}"
    return f"{name}{{{inner}}}"


def rate(name, matchers, extra=""):
    return f"rate({m(name, matchers, extra)}[{RATE}])"


def query(expr, legend, ref="A"):
    return (
        prometheus.Dataquery()
        .expr(expr)
        .legend_format(legend)
        .ref_id(ref)
        .range()
        .datasource(DATASOURCE)
    )


def queries(panel, targets):
    for i, (expr, legend) in enumerate(targets):
        panel = panel.with_target(query(expr, legend, chr(ord("A") + i)))
    return panel


class Layout:
    """Hands out panel ids in order so the JSON is stable."""

    def __init__(self):
        self.next_id = 1

    def id(self):
        value = self.next_id
        self.next_id += 1
        return value


def legend():
    return (
        common_builder.VizLegendOptions()
        .display_mode(common.LegendDisplayMode.TABLE)
        .placement(common.LegendPlacement.RIGHT)
        .show_legend(True)
        .calcs(["lastNotNull", "max"])
    )


def framed(panel, layout, title, description, width, height, targets):
    """Sets what every panel has (id, title, data source, size) and adds its queries."""
    panel = (
        panel.id(layout.id())
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .span(width)
        .height(height)
    )
    return queries(panel, targets)


def ts(layout, title, description, unit, targets, width=12, height=8, stacked=False, minimum=None):
    panel = timeseries.Panel().unit(unit).legend(legend()).fill_opacity(10)
    if stacked:
        panel = panel.stacking(common_builder.StackingConfig().mode(common.StackingMode.NORMAL))
    if minimum is not None:
        panel = panel.min(minimum)
    return framed(panel, layout, title, description, width, height, targets)


def single(layout, title, description, unit, expr, width=6, height=4):
    panel = stat.Panel().unit(unit).reduce_options(
        common_builder.ReduceDataOptions().calcs(["lastNotNull"])
    )
    return framed(panel, layout, title, description, width, height, [(expr, "{{pool}}")])


def timeline(layout, title, description, targets, width=24, height=8):
    return framed(statetimeline.Panel(), layout, title, description, width, height, targets)


def row(title):
    return dash.Row(title)


def variables(board, with_pod, source):
    """datasource -> namespace -> cachecluster -> pool (-> pod), each chained on the last."""
    board = board.with_variable(
        dash.DatasourceVariable("datasource").label("Data source").type("prometheus")
    )

    def chained(name, label, expr, multi):
        var = (
            dash.QueryVariable(name)
            .label(label)
            .datasource(DATASOURCE)
            # qryType 5 is the Prometheus variable editor's "classic query": it shows and
            # runs the label_values(...) text as written.
            .query({"query": expr, "refId": "PrometheusVariableQueryEditor-VariableQuery",
                    "qryType": 5})
            .refresh(dash_model.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(dash_model.VariableSort.ALPHABETICAL_ASC)
        )
        if multi:
            var = var.multi(True).include_all(True).all_value(".*")
        return board.with_variable(var)

    board = chained("namespace", "Namespace", f"label_values({source}, namespace)", False)
    board = chained(
        "cachecluster",
        "CacheCluster",
        f'label_values({source}{{namespace="$namespace"}}, cachecluster)',
        False,
    )
    board = chained("pool", "Pool", f"label_values({m(source, CLUSTER)}, pool)", True)
    if with_pod:
        board = chained("pod", "Pod", f"label_values({m(source, POOLS)}, pod)", False)
    return board


def base(uid, title, description, source, with_pod=False):
    """A dashboard with FlightCache's defaults and variables chained on `source`'s labels."""
    board = (
        dash.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["flightcache", uid.removeprefix("flightcache-")])
        .editable()
        .time("now-1h", "now")
        .refresh("30s")
        .timezone("browser")
        .tooltip(dash_model.DashboardCursorSync.CROSSHAIR)
    )
    return variables(board, with_pod, source)


def add_all(board, items):
    for item in items:
        board = board.with_row(item) if isinstance(item, dash.Row) else board.with_panel(item)
    return board


def ratio_or_zero(numerator, denominator):
    """numerator / denominator, with 0 where the denominator has data and the numerator none."""
    return f"({numerator} or 0 * {denominator}) / {denominator}"


def cache_panels(layout, scope, by, legend_prefix):
    """The cache panels the overview (per pool) and the node view (one pod) share."""
    lookups = f"sum by ({by}) ({rate('flightcache_node_lookups_total', scope)})"
    hits = f"sum by ({by}) ({rate('flightcache_node_lookups_total', scope, RESULT_HIT)})"
    handled = f"sum by ({by}) ({rate('flightcache_node_grpc_server_handled_total', scope)})"
    server_errors = (
        f"sum by ({by}) ({rate('flightcache_node_grpc_server_handled_total', scope, SERVER_ERROR_CODES)})"
    )
    gets = f"sum by ({by}) ({rate('flightcache_node_doget_seconds_count', scope, HIT_OUTCOMES)})"
    forwarded = (
        f"sum by ({by}) ({rate('flightcache_node_doget_seconds_count', scope, OUTCOME_FORWARDED)})"
    )

    def quantile(q):
        return (
            f"histogram_quantile({q}, sum by ({by}, le) "
            f"({rate('flightcache_node_doget_seconds_bucket', scope, HIT_OUTCOMES)}))"
        )

    def gauge(name):
        return f"sum by ({by}) ({m(name, scope)})"

    p = legend_prefix
    return [
        row("Cache"),
        ts(layout, "Hit ratio", "Share of DoGet lookups answered from the cache.", "percentunit",
           [(f"{hits} / {lookups}", p)], minimum=0),
        ts(layout, "Hits and misses", "DoGet lookups per second by result.", "reqps",
           [(f"sum by ({by}, result) ({rate('flightcache_node_lookups_total', scope)})",
             p + " {{result}}")], stacked=True),
        ts(layout, "Hit latency p50 / p95 / p99",
           "DoGet latency of hits (local and forwarded) on the node the client called.", "s",
           [(quantile(0.5), p + " p50"), (quantile(0.95), p + " p95"), (quantile(0.99), p + " p99")]),
        ts(layout, "DoGet latency p99 by outcome",
           "p99 DoGet latency by outcome: local_hit, forwarded_hit, miss, error.", "s",
           [(f"histogram_quantile(0.99, sum by ({by}, outcome, le) "
             f"({rate('flightcache_node_doget_seconds_bucket', scope)}))", p + " {{outcome}}")]),
        row("Memory"),
        ts(layout, "Memory: used vs budget vs limit vs RSS",
           "Arrow bytes held and reserved against the byte budget, the process RSS and the "
           "container memory limit.", "bytes",
           [(gauge("flightcache_node_memory_used_bytes"), p + " used"),
            (gauge("flightcache_node_memory_budget_bytes"), p + " budget"),
            (gauge("flightcache_node_memory_limit_bytes"), p + " limit"),
            (gauge("flightcache_node_process_resident_memory_bytes"), p + " RSS")], width=24),
        ts(layout, "Entries", "Entries held, against the entry cap.", "short",
           [(gauge("flightcache_node_entries"), p + " entries"),
            (gauge("flightcache_node_max_entries"), p + " cap")]),
        ts(layout, "Evictions and expirations by cause",
           "Entries removed per second: expired (TTL), size (budget or cap), explicit "
           "(invalidate), replaced (overwritten), migrated (handed over by a rebalance).", "ops",
           [(f"sum by ({by}, cause) ({rate('flightcache_node_evictions_total', scope)})",
             p + " {{cause}}")], stacked=True),
        row("RPCs"),
        ts(layout, "RPCs by gRPC code", "RPCs completed per second by method and status code "
           "(NotFound is a miss).", "reqps",
           [(f"sum by ({by}, grpc_method, grpc_code) "
             f"({rate('flightcache_node_grpc_server_handled_total', scope)})",
             p + " {{grpc_method}} {{grpc_code}}")], stacked=True),
        ts(layout, "Server error ratio",
           "Share of RPCs that failed through the server's fault (Unknown, Internal, "
           "Unavailable, DataLoss, DeadlineExceeded): the availability SLO's "
           "bad events.", "percentunit",
           [(ratio_or_zero(server_errors, handled), p)], minimum=0),
        ts(layout, "Forwarded share of hits",
           "Share of DoGet hits relayed from the key's owner instead of served locally.",
           "percentunit", [(ratio_or_zero(forwarded, gets), p)], minimum=0),
        ts(layout, "Puts: stored and rejected", "Entries stored and puts refused per second.",
           "ops",
           [(f"sum by ({by}) ({rate('flightcache_node_inserts_total', scope)})", p + " stored"),
            (f"sum by ({by}) ({rate('flightcache_node_puts_rejected_total', scope)})",
             p + " rejected")]),
        ts(layout, "Invalidations by kind",
           "Invalidations clients asked per second by kind (key, prefix, tag, clear), and the "
           "entries they removed across the pool (copies included); 0 while nothing is "
           "invalidated.", "ops",
           [(f"sum by ({by}, kind) ({rate('flightcache_node_invalidations_total', scope)}) "
             f"or 0 * {lookups}", p + " {{kind}}"),
            (f"sum by ({by}, kind) "
             f"({rate('flightcache_node_invalidated_entries_total', scope)}) or 0 * {lookups}",
             p + " {{kind}} entries removed")], width=24),
    ]


def overview():
    layout = Layout()
    board = base(
        "flightcache-overview",
        "FlightCache / Overview",
        "Hit ratio, latency, memory, evictions and errors of one CacheCluster, per pool.",
        "flightcache_node_entries",
    )
    lookups = f"sum by (pool) ({rate('flightcache_node_lookups_total', POOLS)})"
    hits = f"sum by (pool) ({rate('flightcache_node_lookups_total', POOLS, RESULT_HIT)})"
    board = (
        board.with_panel(single(layout, "Hit ratio", "Hits / lookups per pool.", "percentunit",
                                f"{hits} / {lookups}"))
        .with_panel(single(layout, "Lookups/s", "DoGet lookups per second per pool.", "reqps",
                           lookups))
        .with_panel(single(layout, "RSS / memory limit", "Process RSS over the container "
                           "memory limit, worst node of each pool.", "percentunit",
                           f"max by (pool) ({m('flightcache_node_process_resident_memory_bytes', POOLS)}"
                           f" / {m('flightcache_node_memory_limit_bytes', POOLS)})"))
        .with_panel(single(layout, "Nodes up", "Node processes serving metrics per pool.",
                           "short", f"count by (pool) ({m('flightcache_node_entries', POOLS)})"))
    )
    return add_all(board, cache_panels(layout, POOLS, "pool", "{{pool}}")).build()


def node():
    layout = Layout()
    board = base(
        "flightcache-node",
        "FlightCache / Node",
        "One cache node: its cache, memory, ring and config, peers and rebalances.",
        "flightcache_node_entries",
        with_pod=True,
    )
    board = add_all(board, cache_panels(layout, POD, "pod", "{{pod}}"))

    def gauge(name):
        return f"max by (pod) ({m(name, POD)})"

    alive = f"sum by (pod) ({m('flightcache_node_entries', POD)})"
    board = (
        board.with_row(row("Process and topology"))
        .with_panel(ts(layout, "RSS, reserved and allocator-kept bytes",
                       "Process RSS; bytes reserved by puts still streaming in; freed memory "
                       "the allocator keeps resident for reuse (counted in the budget, "
                       "returned within about a second of idling: ADR 0009).", "bytes",
                       [(gauge("flightcache_node_process_resident_memory_bytes"), "RSS"),
                        (gauge("flightcache_node_memory_reserved_bytes"), "reserved"),
                        (gauge("flightcache_node_memory_allocator_cache_bytes"),
                         "allocator kept")]))
        .with_panel(ts(layout, "Ring version and config generation",
                       "The routing ring version and config generation this node runs.", "none",
                       [(gauge("flightcache_node_ring_version"), "ring version"),
                        (gauge("flightcache_node_config_generation"), "config generation")]))
        .with_row(row("Peers and rebalance"))
        .with_panel(ts(layout, "Forwarded calls by peer",
                       "Calls this node relayed to the key's owner, per second.", "reqps",
                       [(f"sum by (peer, grpc_method) "
                         f"({rate('flightcache_node_forwarded_total', POD)}) or 0 * {alive}",
                         "{{peer}} {{grpc_method}}")]))
        .with_panel(ts(layout, "Peer errors by peer",
                       "Failed calls to peers per second: unreachable, timeout, broken, refused.",
                       "reqps",
                       [(f"sum by (peer, reason) "
                         f"({rate('flightcache_node_peer_errors_total', POD)}) or 0 * {alive}",
                         "{{peer}} {{reason}}")]))
        .with_panel(ts(layout, "Rebalance progress",
                       "Whether a rebalance runs, and entries still to hand over.", "short",
                       [(gauge("flightcache_node_rebalance_in_progress"), "in progress"),
                        (gauge("flightcache_node_rebalance_pending_entries"), "pending entries")]))
        .with_panel(ts(layout, "Entries migrated",
                       "Entries handed to their owners and received from other nodes per second.",
                       "ops",
                       [(f"sum by (pod) ({rate('flightcache_node_migrated_out_entries_total', POD)})",
                         "out"),
                        (f"sum by (pod) ({rate('flightcache_node_migrated_in_entries_total', POD)})",
                         "in")]))
    )
    return board.build()


def operator():
    layout = Layout()
    board = base(
        "flightcache-operator",
        "FlightCache / Operator and rollouts",
        "Reconciles, rollout phases, nodes by state, config and ring convergence.",
        "flightcache_operator_pool_shards",
    )
    reconciles = f"sum(rate(flightcache_operator_reconciles_total[{RATE}]))"

    def wanted(name):
        return f"max by (pool) ({m(name, POOLS)})"

    def running(name):
        return f"max by (pool, pod) ({m(name, POOLS)})"

    def latency(q):
        return (f"histogram_quantile({q}, sum by (le) "
                f"(rate(flightcache_operator_reconcile_duration_seconds_bucket[{RATE}])))")

    board = (
        board.with_row(row("Operator"))
        .with_panel(ts(layout, "Reconciles and errors by category",
                       "Reconciles per second, and failed reconciles by pipeline step.", "ops",
                       [(reconciles, "reconciles"),
                        (f"sum by (category) "
                         f"(rate(flightcache_operator_reconcile_errors_total[{RATE}])) "
                         f"or 0 * {reconciles}", "errors {{category}}")]))
        .with_panel(ts(layout, "Reconcile latency", "Reconcile duration p50 and p99.", "s",
                       [(latency(0.5), "p50"), (latency(0.99), "p99")]))
        .with_panel(ts(layout, "Leader", "1 on the operator replica holding the Lease.", "none",
                       [("max by (pod) (flightcache_operator_leader)", "{{pod}}")]))
        .with_panel(ts(layout, "Node call failures by action",
                       "Failed operator calls to nodes per second, by action: configure "
                       "(config and ring pushes) and rebalance.",
                       "ops",
                       [(f"sum by (action) "
                         f"(rate(flightcache_operator_node_call_failures_total[{RATE}])) "
                         f"or 0 * {reconciles}", "{{action}}")]))
        .with_row(row("Rollouts"))
        .with_panel(timeline(layout, "Rollout phase per pool",
                             "The phase each pool's rollout is in (settled when idle).",
                             [(f"max by (pool, phase) "
                               f"({m('flightcache_operator_pool_rollout_phase', POOLS)}) > 0",
                               "{{pool}}: {{phase}}")]))
        .with_panel(ts(layout, "Nodes by state",
                       "Ready, not ready and missing nodes per pool; they sum to the desired shards.",
                       "short",
                       [(f"max by (pool, state) ({m('flightcache_operator_pool_nodes', POOLS)})",
                         "{{pool}} {{state}}"),
                        (wanted("flightcache_operator_pool_shards"), "{{pool}} desired")],
                       stacked=False))
        .with_panel(ts(layout, "Entries moved by rebalances",
                       "Entries moved per window by the rebalances the operator ran, and entries "
                       "the nodes received.", "short",
                       [(f"sum by (pool) (increase("
                         f"{m('flightcache_operator_rebalanced_entries_total', POOLS)}[{RATE}])) "
                         f"or 0 * {wanted('flightcache_operator_pool_shards')}",
                         "{{pool}} moved (operator)"),
                        (f"sum by (pool) (increase("
                         f"{m('flightcache_node_migrated_in_entries_total', POOLS)}[{RATE}]))",
                         "{{pool}} received (nodes)")]))
        .with_panel(ts(layout, "Config generation: nodes vs wanted",
                       "Config generation each node runs, and the one the operator wants.", "none",
                       [(running("flightcache_node_config_generation"), "{{pod}}"),
                        (wanted("flightcache_operator_pool_config_generation"), "{{pool}} wanted")]))
        .with_panel(ts(layout, "Ring version: nodes vs published",
                       "Ring version each node routes by, and the one the operator published.",
                       "none",
                       [(running("flightcache_node_ring_version"), "{{pod}}"),
                        (wanted("flightcache_operator_pool_ring_version"), "{{pool}} published")]))
    )
    return board.build()


DASHBOARDS = {"overview": overview, "node": node, "operator": operator}

# The SDK writes interval-variable defaults onto every variable; Grafana's dashboard schema
# has no such fields on the other variable types, so they are dropped there.
INTERVAL_ONLY_FIELDS = ("auto", "auto_count", "auto_min")


def to_json(board):
    data = json.loads(json.dumps(board, cls=JSONEncoder))
    for variable in data.get("templating", {}).get("list", []):
        if variable.get("type") != "interval":
            for field in INTERVAL_ONLY_FIELDS:
                variable.pop(field, None)
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def main(argv):
    if len(argv) != 2:
        sys.stderr.write("usage: dashboards.py OUTPUT_DIR\n")
        return 2
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for name, build in DASHBOARDS.items():
        (out / f"{name}.json").write_text(to_json(build()), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
