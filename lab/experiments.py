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
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dnslb.config import checked, default_of, setting
from dnslb.errors import ConfigError, DnslbError
from evaluation.columns import CaseResult, markdown_table, table
from lab.loadtest.run import LoadTest, run_loadtest
from lab.loadtest.shape import StepLoad
from lab.report import load_run, write_report
from lab.runner import Lab
from lab.settings import LabSettings

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
        "hysteresis": 0.0,
        "smoothing": 0.0,
        "slow_start": 0.0,
    }


@dataclass(frozen=True, slots=True)
class Case:
    """One case: its row in the table, the paper's tables it replays, its policy (changes to the
    product's defaults)."""

    key: str
    label: str
    tables: tuple[str, ...]
    policy: dict[str, Any]


CASES: tuple[Case, ...] = (
    Case("t1-a", "T1 A TTL 60, no pause (plain DNS RR)", ("1",), plain(60, NEVER)),
    Case("t1-b", "T1 B TTL 60, th_over 0.6", ("1",), plain(60, 0.6)),
    Case("t1-c", "T1 C TTL 60, th_over 0.8", ("1",), plain(60, 0.8)),
    Case("t1-d", "T1 D TTL 60, th_over 1.0", ("1",), plain(60, 1.0)),
    Case("t2-a", "T2 A TTL 30, no pause", ("2",), plain(30, NEVER)),
    Case("t2-b", "T2 B TTL 30, th_over 0.6", ("2",), plain(30, 0.6)),
    Case("t2-c", "T2 C TTL 30, th_over 0.8", ("2",), plain(30, 0.8)),
    Case("t2-d", "T2 D TTL 30, th_over 1.0", ("2",), plain(30, 1.0)),
    Case("t3-a", "T3 A variable TTL, k=1", ("3",), {"k": 1}),
    Case("t3-b", "T3 B variable TTL, k=2", ("3",), {"k": 2}),
    Case("t3-c", "T3 C = T4 product: variable TTL, k=4", ("3", "4"), {"k": 4}),
    Case("t3-d", "T3 D variable TTL, k=8", ("3",), {"k": 8}),
    Case("t4-fixed", "T4 fixed TTL 40, all addresses", ("4",), plain(40, 0.8)),
)

TABLES = ("1", "2", "3", "4")


def results_table(results: dict[str, CaseResult], *, markdown: bool = False) -> str:
    """One table of the paper's columns, a row per case run, in the order of :data:`CASES`."""
    rows = [
        dataclasses.replace(results[case.key], name=case.label)
        for case in CASES
        if case.key in results
    ]
    return markdown_table(rows) if markdown else table(rows)


def read_results(directory: Path) -> dict[str, CaseResult]:
    """The results a run wrote in ``directory/results.json``."""
    try:
        document = json.loads((directory / "results.json").read_text())
        fields = {field.name for field in dataclasses.fields(CaseResult)}
        return {
            key: CaseResult(**{k: v for k, v in values.items() if k in fields})
            for key, values in document["cases"].items()
        }
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError("experiments", [f"{directory}/results.json: {exc}"]) from None


@dataclass(frozen=True, slots=True, kw_only=True)
class ExperimentPlan:
    """How every case is run: each in a lab of ``lab``'s settings (its ports, servers, boot
    delay), in a directory of its own under ``out`` (``lab.workdir`` is not used)."""

    out: Path = setting(help="results directory: a directory a case, results.txt/md/json")
    lab: LabSettings = setting(default_factory=LabSettings, help="every case's lab")
    case_duration: float = setting(
        240.0, help="seconds of load per case (eight steps of at least a second)", min=8
    )
    peak_users: int = setting(105, help="users at the peak", min=1)

    @property
    def load(self) -> StepLoad:
        """6 steps of a seventh of the peak each, a step long, then the peak held a step."""
        every = self.case_duration / 8
        step = max(1, round(self.peak_users / 7))
        return StepLoad(start=step, step=step, every=every, count=6, hold=every)


def run_case(case: Case, plan: ExperimentPlan) -> CaseResult:
    """Run one case in a fresh lab; its files stay in ``plan.out / case.key``."""
    directory = plan.out / case.key
    settings = dataclasses.replace(
        plan.lab,
        workdir=directory / "lab",
        policy=dataclasses.replace(plan.lab.policy, **case.policy),
    )
    lab = Lab(settings, say=lambda text: None)
    try:
        lab.start()
        test = LoadTest(
            out=directory / "loadtest",
            dns_server=f"127.0.0.1:{settings.dns_port}",
            lb_name=settings.dns_name,
            http_port=settings.http_port,
            objects=settings.objects.count,
            load=plan.load,
            seed=1,
            progress=0,
        )
        run_loadtest(test, quiet=True)
    finally:
        lab.stop(quiet=True)
    return write_report(
        load_run(settings.workdir, directory / "loadtest"), directory / "report", name=case.key
    )


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


def run_experiments(plan: ExperimentPlan, cases: list[Case]) -> int:
    """Run ``cases`` one after the other, printing progress, then one table of their results
    (also written to ``plan.out``: results.txt, results.md, results.json); the exit status:
    1 when a case failed (the others still ran)."""
    checked(plan, "experiments")
    out = plan.out
    load = plan.load
    print(
        f"dnslb experiments: {len(cases)} cases of {plan.case_duration:g} s each "
        f"({load.start} users, +{load.step} every {load.every:g} s up to {load.peak}); "
        f"1-{plan.lab.scaling.max_servers} servers; results in {out}",
        flush=True,
    )
    started = time.monotonic()
    results: dict[str, CaseResult] = {}
    failed: list[str] = []
    for number, case in enumerate(cases, 1):
        case_started = time.monotonic()
        try:
            result = run_case(case, plan)
        except DnslbError as exc:  # one broken case must not cost the others' hour
            failed.append(case.key)
            print(f"{number}/{len(cases)} {case.key} failed: {exc}", file=sys.stderr, flush=True)
            continue
        results[case.key] = result
        print(
            f"[{time.monotonic() - started:6.0f} s] {number}/{len(cases)} {case.key}: "
            f"{result.requests} requests, mean {result.mean_response:.3f} s, cost "
            f"{result.cost:.0f}, req/cost {result.requests_per_cost:.2f} "
            f"({time.monotonic() - case_started:.0f} s)",
            flush=True,
        )
    elapsed = time.monotonic() - started
    text = results_table(results)
    footer = f"{len(results)} cases in {elapsed / 60:.1f} min"
    if failed:
        footer += f"; failed: {', '.join(failed)} (see their directories under {out})"
    print(f"\n{text}\n\n{footer}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.txt").write_text(f"{text}\n\n{footer}\n")
    (out / "results.md").write_text(f"{results_table(results, markdown=True)}\n\n{footer}\n")
    (out / "results.json").write_text(
        json.dumps(
            {
                "elapsed_seconds": elapsed,
                "plan": _plan_document(plan),
                "command": sys.argv,
                "cases": {key: result.as_dict() for key, result in results.items()},
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
