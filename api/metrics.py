"""``/metrics`` in the Prometheus text format, read from the manager's views at each scrape.

Nothing is counted here: every figure comes from :class:`dnslb.control.ManagerControl` when
Prometheus asks, so the metrics cannot drift from what the API shows. Counters that the manager
keeps since it started (requests served, answers, report outcomes) reset when it restarts, as
Prometheus expects of counters.

Per pool and location (labels ``pool``, ``location``): the mean utilization of the location's
reporting servers. Per server (labels ``pool``, ``server``): utilization, in-progress requests,
weight, TTL, the intended share of answers (weight / sum of weights in its pool), the delivered
share of its pool's load (requests in progress), the share correction's factor, paused (policy /
operator), state (one series per state, 1 for the current one), report age, cost, requests served,
and answers counted by the pipe backends when the manager has them (those it was in, and those it
came first in). Per pool: servers by state, members of the published plan by state, servers left out
of it, scale events, cost, requests served, mean TTL handed out, launches and failed launches and
whether launching is paused. Per cluster: failovers, controller tick errors, nodes alive. Manager:
last tick's duration, tick errors (whole ticks and parts), plan version, age, refresh and
stale_after, plans refused, publish errors and whether the plan store answered, readiness, agent
reports by outcome. The shipped alerting rules (``deploy/prometheus/dnslb.rules.yml``) read them.

A scrape never fails on what the views hold: every sample is written as a float (an integer too
large for one as ``+Inf``, what is not a number as ``NaN``, both of which the text format
carries), and a label with a lone surrogate has it replaced by U+FFFD.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from dnslb.control import ManagerControl, Telemetry, location_loads
from dnslb.model import ServerState

_SERVER = ["pool", "server"]


class ControlCollector:
    """A Prometheus collector over the manager's views."""

    def __init__(self, control: ManagerControl) -> None:
        self.control = control

    def collect(self) -> Iterable[Metric]:
        telemetry = self.control.telemetry()
        for family in (self._servers, self._pools, self._clusters, self._manager):
            for metric in family(telemetry):
                yield writable(metric)

    def _servers(self, telemetry: Telemetry) -> Iterable[Metric]:
        servers = self.control.servers()
        utilization = GaugeMetricFamily(
            "dnslb_server_utilization", "smoothed utilization (in progress / max)", labels=_SERVER
        )
        in_progress = GaugeMetricFamily(
            "dnslb_server_in_progress", "requests in progress, last report", labels=_SERVER
        )
        weight = GaugeMetricFamily(
            "dnslb_server_weight", "weight in the published plan (answered servers)", labels=_SERVER
        )
        ttl = GaugeMetricFamily(
            "dnslb_server_ttl_seconds", "TTL in the published plan", labels=_SERVER
        )
        share = GaugeMetricFamily(
            "dnslb_server_intended_share",
            "weight / sum of the weights in its pool: the share of answers intended for it",
            labels=_SERVER,
        )
        delivered = GaugeMetricFamily(
            "dnslb_server_delivered_share",
            "smoothed requests in progress / its pool's active servers': the share it carries",
            labels=_SERVER,
        )
        correction = GaugeMetricFamily(
            "dnslb_server_share_correction",
            "the factor the share correction puts on its weight (pools that correct shares)",
            labels=_SERVER,
        )
        paused = GaugeMetricFamily("dnslb_server_paused", "1 when paused", labels=[*_SERVER, "by"])
        state = GaugeMetricFamily(
            "dnslb_server_state", "1 for the server's current state", labels=[*_SERVER, "state"]
        )
        report_age = GaugeMetricFamily(
            "dnslb_server_report_age_seconds", "seconds since its last report", labels=_SERVER
        )
        cost = CounterMetricFamily(
            "dnslb_server_cost_seconds", "server-seconds since it started", labels=_SERVER
        )
        served = CounterMetricFamily(
            "dnslb_server_served_requests",
            "requests served while known to this manager",
            labels=_SERVER,
        )
        answers = CounterMetricFamily(
            "dnslb_server_answers",
            "DNS answers that held it, counted by the pipe backends",
            labels=_SERVER,
        )
        first_answers = CounterMetricFamily(
            "dnslb_server_first_answers",
            "DNS answers that held it first, counted by the pipe backends",
            labels=_SERVER,
        )
        location_load = GaugeMetricFamily(
            "dnslb_location_utilization",
            "mean smoothed utilization of a location's reporting servers (docs/topology.md)",
            labels=["pool", "location"],
        )
        for server in servers:
            labels = [server.pool, server.id]
            for family, figure in (
                (utilization, server.utilization),
                (in_progress, server.in_progress),
                (weight, server.weight),
                (share, server.intended_share),
                (delivered, server.delivered_share),
                (correction, server.share_correction),
                (ttl, server.ttl),
            ):
                if figure is not None:  # not known, or not answered
                    family.add_metric(labels, figure)
            paused.add_metric([*labels, "policy"], 1.0 if server.paused else 0.0)
            paused.add_metric([*labels, "operator"], 1.0 if server.admin_paused else 0.0)
            for each in ServerState:
                state.add_metric([*labels, each.value], 1.0 if server.state is each else 0.0)
            if server.report_age is not None:
                report_age.add_metric(labels, server.report_age)
            cost.add_metric(labels, server.cost_seconds)
            served.add_metric(labels, server.served)
            if server.answers is not None:
                answers.add_metric(labels, server.answers)
            if server.id in telemetry.first_answers:
                first_answers.add_metric(labels, telemetry.first_answers[server.id])
        for load in location_loads(servers):
            if load.utilization is not None:
                location_load.add_metric([load.pool, load.location], load.utilization)
        yield from (utilization, in_progress, weight, ttl, share, delivered, correction, paused)
        yield from (state, report_age)
        yield from (cost, served, answers, first_answers, location_load)

    def _pools(self, telemetry: Telemetry) -> Iterable[Metric]:
        servers = GaugeMetricFamily(
            "dnslb_pool_servers", "servers by state", labels=["pool", "state"]
        )
        scale = CounterMetricFamily(
            "dnslb_pool_scale_events", "scale-out and scale-in events", labels=["pool"]
        )
        cost = CounterMetricFamily(
            "dnslb_pool_cost_seconds",
            "server-seconds, terminated servers included",
            labels=["pool"],
        )
        served = CounterMetricFamily(
            "dnslb_pool_served_requests", "requests served by its servers", labels=["pool"]
        )
        mean_ttl = GaugeMetricFamily(
            "dnslb_pool_mean_ttl_seconds",
            "mean TTL handed out in the published plan (by weight)",
            labels=["pool"],
        )
        answer_k = GaugeMetricFamily(
            "dnslb_pool_answer_addresses",
            "addresses per answer (k, or more while few resolvers hold the pool's answers)",
            labels=["pool"],
        )
        ttl_floor = GaugeMetricFamily(
            "dnslb_pool_ttl_floor_seconds",
            "TTL floor of its answers (ttl_min, or shorter while few resolvers hold them)",
            labels=["pool"],
        )
        holders = GaugeMetricFamily(
            "dnslb_pool_answers_held",
            "answers resolvers hold at a time (the pipe backends' counts, last minute)",
            labels=["pool"],
        )
        for pool in self.control.pools():
            answer_k.add_metric([pool.name], pool.answer_k)
            ttl_floor.add_metric([pool.name], pool.ttl_floor)
            if pool.holders is not None:
                holders.add_metric([pool.name], pool.holders)
            for each in ServerState:
                if each is not ServerState.TERMINATED:
                    servers.add_metric([pool.name, each.value], pool.servers.get(each.value, 0))
            scale.add_metric([pool.name], pool.scale_events)
            cost.add_metric([pool.name], pool.cost_seconds)
            served.add_metric([pool.name], pool.served)
            if pool.mean_ttl is not None:
                mean_ttl.add_metric([pool.name], pool.mean_ttl)
        yield from (servers, scale, cost, served, mean_ttl, answer_k, ttl_floor, holders)

        plan_members = GaugeMetricFamily(
            "dnslb_pool_plan_members",
            "members of the published plan by state (active ones are answered)",
            labels=["pool", "state"],
        )
        left_out = GaugeMetricFamily(
            "dnslb_pool_left_out_servers",
            "servers left out of the plan: a pipe backend would refuse their data",
            labels=["pool"],
        )
        launches = CounterMetricFamily(
            "dnslb_pool_launches", "servers asked of the provider", labels=["pool"]
        )
        failures = CounterMetricFamily(
            "dnslb_pool_launch_failures",
            "launches that failed or never became healthy",
            labels=["pool"],
        )
        backoff = GaugeMetricFamily(
            "dnslb_pool_launch_backoff",
            "1 while launching is paused after failed launches in a row",
            labels=["pool"],
        )
        for figures in telemetry.pools:
            for plan_state, count in sorted(figures.plan_members.items()):
                plan_members.add_metric([figures.name, plan_state], count)
            left_out.add_metric([figures.name], figures.left_out)
            if figures.launches is not None and figures.launch_failures is not None:
                launches.add_metric([figures.name], figures.launches)
                failures.add_metric([figures.name], figures.launch_failures)
                backoff.add_metric([figures.name], 1.0 if figures.launch_backoff else 0.0)
        yield from (plan_members, left_out, launches, failures, backoff)

    def _clusters(self, telemetry: Telemetry) -> Iterable[Metric]:
        failovers = CounterMetricFamily(
            "dnslb_cluster_failovers", "tables installed by failover", labels=["cluster"]
        )
        errors = CounterMetricFamily(
            "dnslb_cluster_tick_errors",
            "parts of the cluster controller's ticks that failed",
            labels=["cluster", "part"],
        )
        alive = GaugeMetricFamily(
            "dnslb_cluster_node_alive",
            "1 while the node is alive (heard from within failover_after, not stuck)",
            labels=["cluster", "node"],
        )
        for cluster in telemetry.clusters:
            failovers.add_metric([cluster.name], cluster.failovers)
            for part, count in sorted(cluster.tick_errors.items()):
                errors.add_metric([cluster.name, part], count)
            for node, up in sorted(cluster.nodes_alive.items()):
                alive.add_metric([cluster.name, node], 1.0 if up else 0.0)
        yield from (failovers, errors, alive)

    def _manager(self, telemetry: Telemetry) -> Iterable[Metric]:
        stats = self.control.stats()
        yield GaugeMetricFamily(
            "dnslb_manager_tick_duration_seconds", "duration of the last tick", stats.tick_seconds
        )
        yield CounterMetricFamily(
            "dnslb_manager_tick_errors", "ticks that failed", stats.tick_errors
        )
        parts = CounterMetricFamily(
            "dnslb_manager_tick_part_errors",
            "parts of ticks that failed (the rest of the tick went on)",
            labels=["part"],
        )
        for part, count in sorted(telemetry.tick_part_errors.items()):
            parts.add_metric([part], count)
        yield parts
        yield GaugeMetricFamily(
            "dnslb_manager_ready", "1 once plans are published", 1.0 if stats.ready else 0.0
        )
        yield GaugeMetricFamily(
            "dnslb_manager_leader",
            "1 while this manager leads (0: a standby)",
            1.0 if stats.role == "leader" else 0.0,
        )
        yield GaugeMetricFamily(
            "dnslb_manager_epoch", "the leadership epoch it leads in (0: none)", stats.epoch
        )
        yield GaugeMetricFamily(
            "dnslb_plan_version", "version of the last published plan", stats.plan_version
        )
        if stats.plan_age is not None:
            yield GaugeMetricFamily(
                "dnslb_plan_age_seconds", "seconds since the plan was published", stats.plan_age
            )
        yield GaugeMetricFamily(
            "dnslb_plan_refresh_seconds",
            "an unchanged plan is republished this often",
            telemetry.plan_refresh,
        )
        yield GaugeMetricFamily(
            "dnslb_plan_stale_after_seconds",
            "pipe backends answer with TTL floors when the plan is older than this",
            telemetry.plan_stale_after,
        )
        yield GaugeMetricFamily(
            "dnslb_plan_refused",
            "1 while the newest plan is not published: a pipe backend would refuse it",
            1.0 if telemetry.plan_refused else 0.0,
        )
        yield CounterMetricFamily(
            "dnslb_plans_refused",
            "plans not published: a pipe backend would refuse them",
            telemetry.plans_refused,
        )
        yield CounterMetricFamily(
            "dnslb_plan_publish_errors",
            "publications the plan store refused or did not answer",
            telemetry.publish_errors,
        )
        if telemetry.store_up is not None:
            yield GaugeMetricFamily(
                "dnslb_plan_store_up",
                "1 when the last publication succeeded, 0 when it failed",
                1.0 if telemetry.store_up else 0.0,
            )
        reports = CounterMetricFamily(
            "dnslb_manager_reports", "agent reports by outcome", labels=["outcome"]
        )
        for outcome, count in sorted(stats.reports.items()):
            reports.add_metric([outcome], count)
        yield reports


def sample(value: object) -> float:
    """A sample's value as the text format can carry it (never an exception)."""
    if isinstance(value, float):
        return value
    if isinstance(value, int):  # bool included
        try:
            return float(value)
        except OverflowError:
            return math.inf if value > 0 else -math.inf
    return math.nan


def label(text: str) -> str:
    """A label value UTF-8 can carry: a lone surrogate becomes U+FFFD."""
    if text.isascii():
        return text
    return "".join("\ufffd" if 0xD800 <= ord(char) <= 0xDFFF else char for char in text)


def writable(metric: Metric) -> Metric:
    """``metric`` with every sample's value and labels made writable (see the module)."""
    metric.samples = [
        each._replace(
            labels={name: label(str(value)) for name, value in each.labels.items()},
            value=sample(each.value),
        )
        for each in metric.samples
    ]
    return metric


def metrics_registry(control: ManagerControl) -> CollectorRegistry:
    """A registry of its own (not the process-wide default) holding the manager's metrics."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ControlCollector(control))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
