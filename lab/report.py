"""The report of a lab run: the paper's columns, plots of the run, its scale events.

``dnslb report`` reads what a lab and a load test left behind and measures the load test's
window (from its start to its end):

- **requests** (every HTTP response and DNS answer the users got): ``requests.csv`` of the load
  test (:mod:`lab.records`); users over time from locust's ``locust_stats_history.csv``;
- **servers, their states and cost**: the manager's events and servers as its REST API gave them
  while the lab ran (:mod:`lab.history`: ``events.jsonl``, ``servers.jsonl``; never its database):
  a server's states are its events' ``to_state``, and it costs from its launch to its
  termination, clipped to the window (server-seconds);
- **per-server utilization, weights and TTLs**: the lab's samples of the published plan
  (``plan-samples.jsonl``, one a second), each member's utilization as the manager's API gave
  it at that moment (the plan holds a pool whose answers did not change, with its old values).

The figures are :class:`~evaluation.columns.CaseResult`'s, computed by
:func:`~evaluation.columns.paper_columns` as the simulator computes them, so that a lab case and a
simulated one read the same way: cost, total response time, requests served, mean response,
requests per cost, the shares of responses under 3 s, 3-9 s and 9-60 s (of served requests),
mean TTL (over the DNS answers the users received), and ours (busiest server over the mean,
server-seconds at 100 %, failed requests, percentiles, DNS lookups, peak servers).

It writes ``report.html`` (tables and PNG plots), ``summary.csv`` (one row: the columns),
``result.json``, ``timeseries.csv`` (a row a second) and the plots.
"""

from __future__ import annotations

import csv
import dataclasses
import html
import itertools
import json
import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dnslb.errors import ConfigError
from dnslb.model import Event, ServerState
from evaluation.columns import (
    COLUMNS,
    CaseResult,
    ResponseStats,
    Series,
    busiest_over_mean,
    overloaded_seconds,
    paper_columns,
)
from lab.history import EVENTS_FILE, SERVERS_FILE, read_events, read_servers
from lab.records import Record, read_records
from lab.runner import SAMPLES_FILE, LabInfo, read_lab_info

BALANCE_WINDOW = 10.0  # seconds: as the simulator's default balance_window
RUN_NAME = "lab run"  # a run's name in tables, unless given one
BOOTING = ("launching", "warming")
LIVE = ("launching", "warming", "active", "down", "draining", "disabled")


@dataclass(frozen=True, slots=True)
class LabResult(CaseResult):
    """One lab run's figures: the shared columns plus what only a measured run has."""

    duration: float  # seconds of the load test's window
    peak_users: int
    throughput: float  # served requests a second over the window


@dataclass(frozen=True, slots=True)
class ServerSpan:
    """One cache server in the window: its life and what it served."""

    id: str
    address: str
    created_at: float
    terminated_at: float | None
    states: tuple[tuple[float, str], ...]  # (time, state), from its launch on
    cost: float  # server-seconds inside the window
    served: int  # responses the users got from it in the window


@dataclass(frozen=True, slots=True)
class LabRun:
    """Everything read from a lab run, cut to the load test's window."""

    info: LabInfo
    loadtest: dict[str, Any]
    start: float
    end: float
    records: tuple[Record, ...]
    servers: tuple[ServerSpan, ...]
    events: tuple[tuple[float, str, str, str], ...]  # (time, kind, server, summary)
    samples: tuple[dict[str, Any], ...]
    users: tuple[tuple[float, int], ...]  # (time, users)


def load_run(lab_dir: Path, loadtest_dir: Path) -> LabRun:
    """Read a lab run; :class:`ConfigError` names what is missing."""
    info = read_lab_info(lab_dir)
    try:
        loadtest = json.loads((loadtest_dir / "loadtest.json").read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(
            "report", [f"{loadtest_dir}: not a load test's output (loadtest.json: {exc})"]
        ) from None
    records_path = loadtest_dir / "requests.csv"
    if not records_path.exists():
        raise ConfigError("report", [f"{records_path}: missing: the load test recorded nothing"])
    records = tuple(read_records(records_path))
    start = float(loadtest["started_at"])
    end = loadtest.get("ended_at")
    if end is None:  # still running, or killed: up to the last request
        end = max((r.start + r.seconds for r in records), default=start)
    end = float(end)
    window = tuple(r for r in records if start <= r.start <= end)
    events_path = lab_dir / EVENTS_FILE
    if not events_path.exists():
        raise ConfigError(
            "report", [f"{events_path}: missing: no manager's events were kept in {lab_dir}"]
        )
    pool = info.dns_name.split(".", 1)[0]
    servers, events = _read_history(lab_dir, pool, start, end, window)
    samples = _read_samples(lab_dir / SAMPLES_FILE, start, end)
    users = _read_users(loadtest_dir / "locust_stats_history.csv", start, end)
    return LabRun(
        info=info,
        loadtest=loadtest,
        start=start,
        end=end,
        records=window,
        servers=servers,
        events=events,
        samples=samples,
        users=users,
    )


def _read_history(
    lab_dir: Path, pool: str, start: float, end: float, records: Sequence[Record]
) -> tuple[tuple[ServerSpan, ...], tuple[tuple[float, str, str, str], ...]]:
    """The pool's servers and events in the window, from what the lab kept of the API's."""
    events = [
        event
        for event in read_events(lab_dir / EVENTS_FILE)
        if event.pool == pool or event.pool is None
    ]
    seen = {server.id: server for server in read_servers(lab_dir / SERVERS_FILE)}
    first: dict[str, float] = {}
    terminated: dict[str, float] = {}
    transitions: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for event in events:
        if event.server is None or event.kind not in ("server_added", "state"):
            continue
        first.setdefault(event.server, event.time)
        if event.kind == "state" and event.to_state is not None:
            transitions[event.server].append((event.time, event.to_state.value))
            if event.to_state is ServerState.TERMINATED:
                terminated[event.server] = event.time
    served = Counter(r.address for r in records if not r.is_dns and r.ok)
    ids = {server_id for server_id, known in seen.items() if known.pool == pool} | set(first)
    servers = []
    for server_id in ids:
        known = seen.get(server_id)
        created = known.created_at if known is not None else first[server_id]
        address = known.address if known is not None else ""
        gone = terminated.get(server_id)
        if gone is not None and gone < start:
            continue  # gone before the window
        if created > end:
            continue
        life_end = min(end, gone) if gone is not None else end
        servers.append(
            ServerSpan(
                id=server_id,
                address=address,
                created_at=created,
                terminated_at=gone,
                states=((created, "launching"), *transitions.get(server_id, [])),
                cost=max(0.0, life_end - max(start, created)),
                served=served.get(address, 0) if address else 0,
            )
        )
    servers.sort(key=lambda span: (span.created_at, span.id))
    return tuple(servers), tuple(_row(event) for event in events if start <= event.time <= end)


def _row(event: Event) -> tuple[float, str, str, str]:
    """An event as the report's table shows it: a state change with its states."""
    return (event.time, event.kind, event.server or "", event.summary)


def _read_samples(path: Path, start: float, end: float) -> tuple[dict[str, Any], ...]:
    samples = []
    try:
        with open(path) as handle:
            for line in handle:
                try:
                    sample = json.loads(line)
                except ValueError:
                    break  # cut short: the lab was killed mid-line
                if start <= sample["t"] <= end:
                    samples.append(sample)
    except OSError:
        return ()
    return tuple(samples)


def _read_users(path: Path, start: float, end: float) -> tuple[tuple[float, int], ...]:
    users = []
    try:
        with open(path, newline="") as handle:
            for row in csv.DictReader(handle):
                if row.get("Name") != "Aggregated":
                    continue
                when = float(row["Timestamp"])
                if start - 1 <= when <= end + 1:
                    users.append((when, int(row["User Count"])))
    except (OSError, ValueError, KeyError):
        return ()
    return tuple(users)


def state_at(span: ServerSpan, when: float) -> str | None:
    """The state of a server at ``when`` (None before its launch)."""
    current = None
    for at, state in span.states:
        if at > when:
            break
        current = state
    return current


def measure(run: LabRun, name: str) -> LabResult:
    """The figures of a run."""
    http = [r for r in run.records if not r.is_dns]
    served = [r.seconds for r in http if r.ok]
    stats = ResponseStats.from_times(served)
    answers = [r for r in run.records if r.is_dns and r.ok and r.ttl is not None]
    cost = sum(span.cost for span in run.servers)
    utilization = _utilization(run)
    duration = run.end - run.start
    saturated = sum(
        interval
        for points in utilization.values()
        for (_, value), interval in zip(points, _intervals(points, duration), strict=True)
        if value >= 1.0
    )
    peak = 0
    step = 1.0
    moments = [run.start + i * step for i in range(int(duration / step) + 1)]
    for when in moments:
        live = sum(1 for span in run.servers if state_at(span, when) in LIVE)
        peak = max(peak, live)
    return LabResult(
        name=name,
        **paper_columns(
            stats,
            cost=cost,
            ttl_total=float(sum(r.ttl for r in answers if r.ttl is not None)),
            answers=len(answers),
        ),
        busiest_over_mean=busiest_over_mean(
            {key: list(points) for key, points in utilization.items()}, BALANCE_WINDOW, duration
        ),
        saturated_seconds=saturated,
        overloaded_seconds=overloaded_seconds(utilization, duration),
        pause_flips=sum(1 for _, kind, _, _ in run.events if kind in ("paused", "resumed")),
        failed=sum(1 for r in http if not r.ok),
        peak_servers=peak,
        duration=duration,
        peak_users=max((count for _, count in run.users), default=0),
        throughput=len(served) / duration if duration > 0 else 0.0,
    )


def _intervals(points: Sequence[tuple[float, float]], until: float) -> list[float]:
    """How long each sample stands for: up to the next one (the last: one sample interval)."""
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(points)]
    last = gaps[-1] if gaps else 1.0
    return [min(gap, 5.0) for gap in gaps] + [min(last, max(0.0, until - points[-1][0]))]


def _utilization(run: LabRun) -> dict[str, tuple[tuple[float, float], ...]]:
    """Per server: (seconds into the window, utilization) from the plan samples."""
    points: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for sample in run.samples:
        when = sample["t"] - run.start
        for member in sample["members"]:
            server, state, value = member[0], member[2], member[3]
            if state in ("active", "paused"):
                points[server].append((when, float(value)))
    return {server: tuple(values) for server, values in points.items()}


def series(run: LabRun) -> Series:
    """What the plots show, a point a second of the window."""
    duration = run.end - run.start
    seconds = max(1, math.ceil(duration))
    times = tuple(float(i) for i in range(seconds))
    ttl_sum = [0.0] * seconds
    ttl_count = [0] * seconds
    response_sum = [0.0] * seconds
    response_count = [0] * seconds
    for record in run.records:
        slot = min(seconds - 1, max(0, int(record.start - run.start)))
        if record.is_dns:
            if record.ok and record.ttl is not None:
                ttl_sum[slot] += record.ttl
                ttl_count[slot] += 1
        elif record.ok:
            response_sum[slot] += record.seconds
            response_count[slot] += 1
    serving = [0] * seconds
    paused = [0] * seconds
    draining = [0] * seconds
    booting = [0] * seconds
    by_second: dict[int, dict[str, Any]] = {}
    for each in run.samples:
        by_second.setdefault(int(each["t"] - run.start), each)
    last: dict[str, Any] | None = None
    for slot in range(seconds):
        last = by_second.get(slot, last)
        published: set[str] = set()
        if last is not None:
            states = Counter(member[2] for member in last["members"])
            serving[slot] = states["active"]
            paused[slot] = states["paused"]
            draining[slot] = states["draining"]
            published = {member[0] for member in last["members"]}
        when = run.start + slot
        for span in run.servers:
            if span.id in published:
                continue  # counted from the plan (its state there is what clients saw)
            state = state_at(span, when)
            if state in BOOTING:
                booting[slot] += 1
            elif state == "draining":
                draining[slot] += 1
    users = [0] * seconds
    for when, count in run.users:
        slot = int(when - run.start)
        if 0 <= slot < seconds:
            users[slot] = count
    for slot in range(1, seconds):  # locust writes its history every second or so
        if users[slot] == 0 and users[slot - 1]:
            users[slot] = users[slot - 1]
    return Series(
        times=times,
        utilization=_utilization(run),
        serving=tuple(serving),
        paused=tuple(paused),
        booting=tuple(booting),
        draining=tuple(draining),
        answer_ttl=tuple(
            ttl_sum[i] / ttl_count[i] if ttl_count[i] else math.nan for i in range(seconds)
        ),
        mean_response=tuple(
            response_sum[i] / response_count[i] if response_count[i] else math.nan
            for i in range(seconds)
        ),
        users=tuple(users),
    )


def _cell(result: CaseResult, attr: str, fmt: str) -> str:
    value = getattr(result, attr)
    if attr in ("under_3", "from_3_to_9", "from_9_to_60"):
        value = value * 100
    return str(fmt.format(value))


def write_report(run: LabRun, out: Path, *, name: str = RUN_NAME) -> LabResult:
    """Write the report of ``run`` into ``out``; returns its figures."""
    from evaluation.plots import write_plots  # noqa: PLC0415 (matplotlib: only here)

    out.mkdir(parents=True, exist_ok=True)
    result = measure(run, name)
    data = series(run)
    plots = write_plots(data, out, name)
    (out / "result.json").write_text(json.dumps(result.as_dict(), indent=2) + "\n")
    with open(out / "summary.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        fields = [field.name for field in dataclasses.fields(result)]
        writer.writerow(fields)
        writer.writerow([getattr(result, field) for field in fields])
    with open(out / "timeseries.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            ["second", "users", "serving", "paused", "booting", "draining", "mean_ttl", "mean_s"]
        )
        for i, when in enumerate(data.times):
            writer.writerow(
                [
                    int(when),
                    data.users[i],
                    data.serving[i],
                    data.paused[i],
                    data.booting[i],
                    data.draining[i],
                    "" if math.isnan(data.answer_ttl[i]) else f"{data.answer_ttl[i]:.2f}",
                    "" if math.isnan(data.mean_response[i]) else f"{data.mean_response[i]:.4f}",
                ]
            )
    (out / "report.html").write_text(_html(run, result, [p.name for p in plots], name))
    return result


def _html(run: LabRun, result: LabResult, plots: list[str], name: str) -> str:
    escape = html.escape
    header = "".join(f"<th>{escape(title)}</th>" for title, _, _ in COLUMNS)
    cells = "".join(
        f"<td>{escape(_cell(result, attr, fmt) if attr != 'name' else result.name)}</td>"
        for _, fmt, attr in COLUMNS
    )
    settings = run.info.settings
    policy = settings.get("policy", {})
    scaling = settings.get("scaling", {})
    test = run.loadtest.get("test", {})
    load = test.get("load", {})
    server_rows = "".join(
        f"<tr><td>{escape(span.id)}</td><td>{escape(span.address)}</td>"
        f"<td>{span.created_at - run.start:+.0f}</td>"
        f"<td>{_active_at(span, run.start)}</td>"
        f"<td>{'' if span.terminated_at is None else f'{span.terminated_at - run.start:+.0f}'}</td>"
        f"<td>{span.cost:.0f}</td><td>{span.served}</td></tr>"
        for span in run.servers
    )
    event_rows = "".join(
        f"<tr><td>{when - run.start:+.1f}</td><td>{escape(kind)}</td><td>{escape(server)}</td>"
        f"<td>{escape(reason)}</td></tr>"
        for when, kind, server, reason in run.events
        if kind in ("scale_out", "scale_in", "state", "launch_failed")
    )
    pauses = sum(1 for _, kind, _, _ in run.events if kind == "paused")
    images = "".join(f'<p><img src="{escape(plot)}" alt="{escape(plot)}"></p>' for plot in plots)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>dnslb lab report: {escape(name)}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; max-width: 80em; }}
table {{ border-collapse: collapse; margin: 1em 0; }}
th, td {{ border: 1px solid #bbb; padding: 0.25em 0.6em; text-align: right; }}
td:first-child, th:first-child {{ text-align: left; }}
img {{ max-width: 100%; }}
</style></head><body>
<h1>dnslb lab report: {escape(name)}</h1>
<p>Load test window: {result.duration:.0f} s, up to {result.peak_users} users
({escape(str(load.get("start")))} at the start, +{escape(str(load.get("step")))} every
{escape(str(load.get("every")))} s, {escape(str(load.get("count")))} steps, held
{escape(str(load.get("hold")))} s); think time {escape(str(test.get("think_time")))} s;
{escape(str(test.get("ignore_ttl")))} of users ignore TTLs; they connect to the
{escape(str(test.get("connect")))} address.</p>
<p>Policy: k={escape(str(policy.get("k")))}, TTL {escape(str(policy.get("ttl_min")))}-{
        escape(str(policy.get("ttl_max")))
    } s, th_over {escape(str(policy.get("th_over")))},
weights {escape(str(policy.get("weight_function")))}. Autoscaling
{escape(str(scaling.get("min_servers")))}-{escape(str(scaling.get("max_servers")))} servers,
th_high {escape(str(scaling.get("th_high")))}, th_low {escape(str(scaling.get("th_low")))}; boot
delay {escape(str(settings.get("boot_delay")))} s. Each cache server starts at most
{escape(str(settings.get("capacity_rps")))} requests a second, max concurrency
{escape(str(settings.get("max_concurrency")))}.</p>
<h2>The paper's columns (and ours)</h2>
<table><tr>{header}</tr><tr>{cells}</tr></table>
<p>Cost: server-seconds of the cache servers inside the window. Response times of served
requests (failed ones are counted apart); mean TTL over the DNS answers the users received
({result.dns_queries} lookups). Throughput {result.throughput:.1f} requests a second; {pauses}
pauses.</p>
<h2>Plots</h2>
{images}
<h2>Servers</h2>
<table><tr><th>server</th><th>address</th><th>launched (s)</th><th>serving from (s)</th>
<th>terminated (s)</th><th>cost</th><th>responses</th></tr>{server_rows}</table>
<h2>Scale events and server states</h2>
<table><tr><th>time (s)</th><th>kind</th><th>server</th><th>reason</th></tr>{event_rows}</table>
</body></html>
"""


def _active_at(span: ServerSpan, start: float) -> str:
    for when, state in span.states:
        if state == "active":
            return f"{when - start:+.0f}"
    return ""


def newest_loadtest(lab_dir: Path) -> Path:
    """The newest load test under ``lab_dir/loadtest``."""
    runs = sorted(
        (p for p in (lab_dir / "loadtest").glob("*") if (p / "loadtest.json").exists()),
        key=lambda p: p.stat().st_mtime,
    )
    if not runs:
        raise ConfigError(
            "report", [f"{lab_dir}/loadtest: no load test there; give --loadtest DIR"]
        )
    return runs[-1]
