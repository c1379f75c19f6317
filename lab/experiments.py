"""``dnslb experiments``: the paper's cases replayed on the lab, one table of the paper's columns.

The research's evaluation (tables 1-4 of ``research/002``), scaled down to one 2-core machine:
a lab of 1 to ``max_servers`` cache servers (4 by default, the paper had 10), a step load of
users raised every ``case_duration / 8`` seconds for 6 steps and held for one more step, the
same for every case. Each case runs in a fresh lab (its own directory: state, plan samples,
load test and report are kept) one after the other, so cases never share CPU time.

- Table 1 (TTL 60) and table 2 (TTL 30): plain DNS round-robin (every address in every answer,
  equal weights, a fixed TTL) without pausing ("no pause": th_over so high it never happens)
  and with pausing above th_over 0.6, 0.8 and 1.0. Table 1's "no pause" case is plain DNS
  round-robin, the baseline everything else is measured against.
- Table 3: the product's policy (weights from spare capacity, TTL from 60 s down to 5 s with
  load, pause above 0.8) with k = 1, 2, 4, 8 addresses per answer.
- Table 4: the product (k = 4, table 3's case) against a fixed 40 s TTL with every address.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dnslb.config import checked, default_of, setting
from dnslb.errors import ConfigError, DnslbError
from evaluation.columns import CaseResult, markdown_table, table
from lab.loadtest.run import LoadTest, run_loadtest
from lab.loadtest.shape import StepLoad
from lab.repeats import ci_table, orderings, summarize
from lab.report import load_run, write_report
from lab.resolvers import Resolvers
from lab.runner import Lab, interrupts
from lab.settings import LabSettings

if TYPE_CHECKING:  # dnspython, which it imports, is the lab extra's
    from lab.loadtest.resolver import Lookup

ALL_ADDRESSES = 16  # k above any lab pool's size: every eligible address in every answer
NEVER = 1000.0  # th_over no utilization reaches: pausing off


def plain(ttl: int, th_over: float) -> dict[str, Any]:
    """Plain DNS round-robin (every address, equal weights, fixed TTL) with pausing above
    ``th_over`` (:data:`NEVER`: no pausing)."""
    return {
        "k": ALL_ADDRESSES,
        "weight_function": "equal",
        "ttl_min": ttl,
        "ttl_max": ttl,
        "th_over": th_over,
        "pause_relative": 0.0,  # the paper's pausing: th_over alone
        "pause_dwell": 0.0,
        "hysteresis": 0.0,
        "smoothing": 0.0,
        "slow_start": 0.0,
    }


@dataclass(frozen=True, slots=True)
class Case:
    """One case: its row in the table, the paper's tables it replays, its policy and its
    autoscaling (changes to the product's defaults)."""

    key: str
    label: str
    tables: tuple[str, ...]
    policy: dict[str, Any]
    scaling: dict[str, Any] = field(default_factory=dict)

    def settings(self, lab: LabSettings) -> LabSettings:
        """``lab`` with this case's changes to the pool's policy and autoscaling."""
        return dataclasses.replace(
            lab,
            policy=dataclasses.replace(lab.policy, **self.policy),
            scaling=dataclasses.replace(lab.scaling, **self.scaling),
        )


CASES: tuple[Case, ...] = (
    Case("t1-a", "T1 A TTL 60, no pause (plain DNS RR)", ("1",), plain(60, NEVER)),
    Case("t1-b", "T1 B TTL 60, th_over 0.6", ("1",), plain(60, 0.6)),
    Case("t1-c", "T1 C TTL 60, th_over 0.8", ("1",), plain(60, 0.8)),
    Case("t1-d", "T1 D TTL 60, th_over 1.0", ("1",), plain(60, 1.0)),
    Case("t2-a", "T2 A TTL 30, no pause", ("2",), plain(30, NEVER)),
    Case("t2-b", "T2 B TTL 30, th_over 0.6", ("2",), plain(30, 0.6)),
    Case("t2-c", "T2 C TTL 30, th_over 0.8", ("2",), plain(30, 0.8)),
    Case("t2-d", "T2 D TTL 30, th_over 1.0", ("2",), plain(30, 1.0)),
    # The paper's k, whatever the resolvers; the product (C) raises it while few hold answers.
    Case("t3-a", "T3 A variable TTL, k=1", ("3",), {"k": 1, "k_coverage": 0.0}),
    Case("t3-b", "T3 B variable TTL, k=2", ("3",), {"k": 2, "k_coverage": 0.0}),
    Case("t3-c", "T3 C = T4 product: variable TTL, k=4", ("3", "4"), {"k": 4}),
    Case("t3-d", "T3 D variable TTL, k=8", ("3",), {"k": 8, "k_coverage": 0.0}),
    Case("t4-fixed", "T4 fixed TTL 40, all addresses", ("4",), plain(40, 0.8)),
    Case(
        "t4-target",
        "T4 product, pool sized for a 2 s wait (99 %)",
        ("4",),
        {"k": 4},
        {"target_wait": 2.0},
    ),
    Case(
        "t4-even",
        "T4 product, pool sized for a 2 s wait (99 %) as if even",
        ("4",),
        {"k": 4},
        {"target_wait": 2.0, "target_imbalance": False},
    ),
)

TABLES = ("1", "2", "3", "4")


def results_table(results: dict[str, list[CaseResult]], *, markdown: bool = False) -> str:
    """One table of the paper's columns, a row per case in the order of :data:`CASES`: with
    one run per case its figures, with more each column's mean ±95 % interval."""
    present = [case for case in CASES if results.get(case.key)]
    if all(len(results[case.key]) == 1 for case in present):
        rows = [dataclasses.replace(results[case.key][0], name=case.label) for case in present]
        return markdown_table(rows) if markdown else table(rows)
    text = ci_table({case.label: results[case.key] for case in present})
    return _markdown(text) if markdown else text


def _markdown(text: str) -> str:
    lines = [re.split(r"\s{2,}", line.strip()) for line in text.splitlines()]
    out = ["| " + " | ".join(lines[0]) + " |", "|" + "---|" * len(lines[0])]
    out += ["| " + " | ".join(cells) + " |" for cells in lines[1:]]
    return "\n".join(out)


def ordering_lines(results: dict[str, list[CaseResult]]) -> list[str]:
    """Which of the paper's orderings hold between the cases run (:func:`lab.repeats.orderings`)."""
    summaries = {key: summarize(runs) for key, runs in results.items() if runs}
    return orderings(summaries)


def read_results(directory: Path) -> dict[str, list[CaseResult]]:
    """The results a run wrote in ``directory/results.json`` (case key -> its runs; an older
    file's single run per case too)."""
    try:
        document = json.loads((directory / "results.json").read_text())
        fields = {field.name for field in dataclasses.fields(CaseResult)}
        cases: dict[str, list[CaseResult]] = {}
        for key, stored in document["cases"].items():
            runs = stored if isinstance(stored, list) else [stored]
            cases[key] = [
                CaseResult(**{k: v for k, v in values.items() if k in fields}) for values in runs
            ]
        return cases
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError("experiments", [f"{directory}/results.json: {exc}"]) from None


SERVERS = 10
"""The experiments' autoscaling ceiling: the paper's 10 cache servers."""


def experiment_lab() -> LabSettings:
    """The lab every case runs in: the lab's defaults, up to :data:`SERVERS` cache servers."""
    lab = LabSettings()
    return dataclasses.replace(lab, scaling=dataclasses.replace(lab.scaling, max_servers=SERVERS))


@dataclass(frozen=True, slots=True, kw_only=True)
class ExperimentPlan:
    """How every case is run: each in a lab of ``lab``'s settings (its ports, servers, boot
    delay), in a directory of its own under ``out`` (``lab.workdir`` is not used)."""

    out: Path = setting(help="results directory: a directory a case, results.txt/md/json")
    lab: LabSettings = setting(
        default_factory=experiment_lab, help="every case's lab (up to 10 servers)"
    )
    case_duration: float = setting(
        240.0, help="seconds of load per run (eight steps of at least a second)", min=8
    )
    peak_users: int = setting(
        160, help="users at the peak (past 4 servers' capacity)", min=1, max=2000
    )
    constant_load: bool = setting(
        False, help="peak_users for the whole run instead of the step load"
    )
    repeats: int = setting(5, help="runs of each case (means and 95 % intervals)", min=1, max=50)
    staggered: bool = setting(
        True,
        help="each resolver starts with a real answer that expires at a random moment of its "
        "TTL, out of phase with the others, as resolvers in the wild are (false: every "
        "resolver starts empty and asks at the users' first queries, all together)",
    )

    @property
    def load(self) -> StepLoad:
        """A fifth of the peak, then a fifth more every eighth of the run up to the peak at half
        of it, held to the end: steps faster than the autoscaler (10 s of evidence, 10 s of
        boot) catches up with, so the pool is past its capacity after each step. With
        ``constant_load``, the peak from start to end (how pausing behaves at a load held)."""
        if self.constant_load:
            return StepLoad(
                start=self.peak_users, step=0, every=self.case_duration, count=0, hold=0.0
            )
        every = self.case_duration / 8
        step = max(1, round(self.peak_users / 5))
        return StepLoad(start=step, step=step, every=every, count=4, hold=3 * every)

    def estimate(self, cases: int) -> float:
        """Seconds a run of ``cases`` cases takes: each repeat its load plus
        :data:`RUN_OVERHEAD` (lab start and stop, report)."""
        return cases * self.repeats * (self.case_duration + RUN_OVERHEAD)


RUN_OVERHEAD = 30.0
"""Seconds a run takes beyond its load: the lab's start (first server boots in ``boot_delay``),
its stop, the report. Measured: 13 runs of 240 s in 55.3 min (15 s each, 4 servers); 30 s
leaves room for 10 servers to stop and a busier machine."""

HEADLINE = ("t1-a", "t2-c", "t3-c", "t4-fixed")
"""The headline cases: plain round-robin TTL 60, round-robin TTL 30 pausing above 0.8, the
product (k = 4), a fixed 40 s TTL with every address."""

PRESETS: dict[str, dict[str, Any]] = {
    # 4 cases x 2 repeats x (120 + 30) s = 20 min; a run must outlast the first answer's TTL
    # (60 s): in runs of 60 s every user kept the single first server's address throughout
    "quick": {"cases": HEADLINE, "repeats": 2, "case_duration": 120.0},
    # 4 cases x 5 repeats x (300 + 30) s = 110 min
    "full": {"cases": HEADLINE, "repeats": 5, "case_duration": 300.0},
}
"""``--preset``: the headline cases, repeats and run length that fit 20 minutes (quick) and 2
hours (full), by :meth:`ExperimentPlan.estimate`."""


def servers_range(lab: LabSettings) -> str:
    """The pool's size as the autoscaler may set it: ``4`` for a fixed pool, ``1-10``."""
    low, high = lab.scaling.min_servers, lab.scaling.max_servers
    return f"{low}" if low == high else f"{low}-{high}"


def run_case(case: Case, plan: ExperimentPlan, repeat: int = 1) -> CaseResult:
    """Run one case once in a fresh lab (seed ``repeat``); its files stay in
    ``plan.out / case.key / run-REPEAT``."""
    directory = plan.out / case.key / f"run-{repeat}"
    settings = dataclasses.replace(case.settings(plan.lab), workdir=directory / "lab")
    lab = Lab(settings, say=lambda text: None)
    # SIGTERM and SIGHUP stop the run as Ctrl-C does: the lab's processes are stopped, never
    # left running (a second signal while they stop is ignored).
    with interrupts():
        try:
            lab.start()
            if plan.staggered and lab.resolvers is not None:
                from lab.loadtest.resolver import dns_lookup  # noqa: PLC0415 (the lab extra)

                pdns = dns_lookup("127.0.0.1", settings.dns_port)
                warm_resolvers(lab.resolvers, settings.dns_name, pdns, random.Random(repeat))
            test = LoadTest(
                out=directory / "loadtest",
                dns_server=lab.info.dns_servers() if lab.info else f"127.0.0.1:{settings.dns_port}",
                lb_name=settings.dns_name,
                http_port=settings.http_port,
                objects=settings.objects.count,
                load=plan.load,
                seed=repeat,
                progress=0,
            )
            run_loadtest(test, quiet=True)
        finally:
            with interrupts(ignore=True):
                lab.stop(quiet=True)
    return write_report(
        load_run(settings.workdir, directory / "loadtest"), directory / "report", name=case.key
    )


def warm_resolvers(
    resolvers: Resolvers, name: str, lookup: Lookup, rng: random.Random
) -> list[int]:
    """Start each resolver with an answer for ``name`` that expires at a moment of its TTL
    drawn uniformly, independently of the others; returns the TTLs left, in the resolvers'
    order.

    Each answer is a real one (``lookup`` asks pdns, once a resolver, so each gets the answer
    its own query would have), put in the resolver's cache with ``1 + floor(uniform(0, TTL))``
    seconds left: as if each had asked at a random moment of the last TTL, as resolvers in the
    wild are out of phase, and as the simulator's resolvers start (``staggered``). Left empty,
    every resolver asks at the users' first queries and again when that answer expires, all
    together: round-robin's users then move in one block each TTL.
    """
    answers = [lookup(name) for _ in resolvers.addresses]
    left = [1 + math.floor(rng.uniform(0.0, answer.ttl)) for answer in answers]
    resolvers.preload(
        name, [(answer.addresses, ttl) for answer, ttl in zip(answers, left, strict=True)]
    )
    return left


def select_cases(tables: str | None = None, pattern: str | None = None) -> list[Case]:
    """The cases of ``tables`` (``"1,3"``; None: all) whose key matches ``pattern`` (a regex);
    :class:`ConfigError` for a table that does not exist or when no case is left."""
    wanted = set(tables.split(",")) if tables else set(TABLES)
    unknown = wanted - set(TABLES)
    if unknown:
        raise ConfigError("experiments", [f"tables: no table {', '.join(sorted(unknown))}"])
    cases = [case for case in CASES if wanted & set(case.tables)]
    if pattern:
        try:
            search = re.compile(pattern).search
        except re.error as exc:
            raise ConfigError("experiments", [f"cases: not a regex: {exc}"]) from None
        cases = [case for case in cases if search(case.key)]
    if not cases:
        raise ConfigError("experiments", ["no case selected"])
    return cases


def select_preset(name: str) -> list[Case]:
    """The cases of preset ``name`` (:data:`PRESETS`)."""
    keys = PRESETS[name]["cases"]
    return [case for case in CASES if case.key in keys]


def eta_text(plan: ExperimentPlan, done: int, total: int, elapsed: float) -> str:
    """How long the rest of ``total`` runs will take after ``done`` in ``elapsed`` seconds: the
    mean run so far times the runs left (before the first: the plan's estimate)."""
    left = total - done
    per_run = elapsed / done if done else plan.case_duration + RUN_OVERHEAD
    return f"ETA {left * per_run / 60:.1f} min"


def run_experiments(plan: ExperimentPlan, cases: list[Case]) -> int:
    """Run every case ``plan.repeats`` times (all cases once, then again: a drift of the
    machine spreads over them), printing progress and an ETA, then one table of their means and
    95 % intervals and which of the paper's orderings hold (also written to ``plan.out``:
    results.txt, results.md, results.json); the exit status: 1 when a run failed (the others
    still ran)."""
    checked(plan, "experiments")
    out = plan.out
    load = plan.load
    total = len(cases) * plan.repeats
    print(
        f"dnslb experiments: {len(cases)} cases x {plan.repeats} repeats of "
        f"{plan.case_duration:g} s ({load.start} users, +{load.step} every {load.every:g} s up "
        f"to {load.peak}); {servers_range(plan.lab)} servers, "
        f"{plan.lab.resolvers} resolvers; about {plan.estimate(len(cases)) / 60:.0f} min; "
        f"results in {out}",
        flush=True,
    )
    started = time.monotonic()
    results: dict[str, list[CaseResult]] = {case.key: [] for case in cases}
    failed: list[str] = []
    done = 0
    for repeat in range(1, plan.repeats + 1):
        for case in cases:
            run_started = time.monotonic()
            try:
                result = run_case(case, plan, repeat)
            except DnslbError as exc:  # one broken run must not cost the others' hour
                failed.append(f"{case.key}/run-{repeat}")
                print(f"{case.key} run {repeat} failed: {exc}", file=sys.stderr, flush=True)
                result = None
            done += 1
            elapsed = time.monotonic() - started
            if result is not None:
                results[case.key].append(result)
                print(
                    f"[{elapsed:6.0f} s] {done}/{total} {case.key} run {repeat}: "
                    f"{result.requests} requests, mean {result.mean_response:.3f} s, "
                    f"3-9 s {result.from_3_to_9 * 100:.2f} %, 9-60 s "
                    f"{result.from_9_to_60 * 100:.2f} %, cost {result.cost:.0f} "
                    f"({time.monotonic() - run_started:.0f} s); "
                    f"{eta_text(plan, done, total, elapsed)}",
                    flush=True,
                )
    elapsed = time.monotonic() - started
    results = {key: runs for key, runs in results.items() if runs}
    text = results_table(results)
    verdicts = ordering_lines(results)
    footer = f"{done - len(failed)} runs of {len(cases)} cases in {elapsed / 60:.1f} min"
    if failed:
        footer += f"; failed: {', '.join(failed)} (see their directories under {out})"
    said = "\n".join(["", "The paper's orderings (95 % intervals):", *verdicts]) if verdicts else ""
    print(f"\n{text}\n{said}\n\n{footer}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.txt").write_text(f"{text}\n{said}\n\n{footer}\n")
    (out / "results.md").write_text(
        f"{results_table(results, markdown=True)}\n{said}\n\n{footer}\n"
    )
    (out / "results.json").write_text(
        json.dumps(
            {
                "elapsed_seconds": elapsed,
                "plan": _plan_document(plan),
                "command": sys.argv,
                "orderings": verdicts,
                "cases": {key: [r.as_dict() for r in runs] for key, runs in results.items()},
            },
            indent=2,
        )
        + "\n"
    )
    return 1 if failed else 0


def _plan_document(plan: ExperimentPlan) -> dict[str, str]:
    """What results.json says of the plan (as strings, as it always has)."""
    lab = plan.lab
    return {
        "out": str(plan.out),
        "case_duration": str(plan.case_duration),
        "peak_users": str(plan.peak_users),
        "repeats": str(plan.repeats),
        "resolvers": str(lab.resolvers),
        "rrset_roundrobin": str(lab.rrset_roundrobin),
        "staggered": str(plan.staggered),
        "think_time": str(default_of(LoadTest, "think_time")),
        "ignore_ttl": str(default_of(LoadTest, "ignore_ttl")),
        "max_servers": str(lab.scaling.max_servers),
        "boot_delay": str(lab.boot_delay),
        "dns_port": str(lab.dns_port),
        "api_port": str(lab.api_port),
        "http_port": str(lab.http_port),
        "origin_port": str(lab.origin_port),
        "network": lab.network,
    }
