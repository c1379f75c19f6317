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

import argparse
import dataclasses
import json
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dnslb.errors import ConfigError
from dnslb.evaluation import CaseResult, markdown_table, table
from dnslb.lab.report import load_run, write_report
from dnslb.lab.runner import Lab, default_workdir
from dnslb.lab.settings import LabSettings, default_scaling
from dnslb.policy import PoolPolicy
from loadtest.run import LoadTest, run_loadtest
from loadtest.shape import StepLoad

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
    """One case: the tables it is in and its policy (changes to the product's defaults)."""

    key: str
    tables: tuple[str, ...]
    names: tuple[str, ...]  # its name in each of its tables
    policy: dict[str, Any]


CASES: tuple[Case, ...] = (
    Case("t1-a", ("1",), ("A no pause (plain DNS round-robin)",), plain(60, NEVER)),
    Case("t1-b", ("1",), ("B th_over 0.6",), plain(60, 0.6)),
    Case("t1-c", ("1",), ("C th_over 0.8",), plain(60, 0.8)),
    Case("t1-d", ("1",), ("D th_over 1.0",), plain(60, 1.0)),
    Case("t2-a", ("2",), ("A no pause",), plain(30, NEVER)),
    Case("t2-b", ("2",), ("B th_over 0.6",), plain(30, 0.6)),
    Case("t2-c", ("2",), ("C th_over 0.8",), plain(30, 0.8)),
    Case("t2-d", ("2",), ("D th_over 1.0",), plain(30, 1.0)),
    Case("t3-a", ("3",), ("A k=1",), {"k": 1}),
    Case("t3-b", ("3",), ("B k=2",), {"k": 2}),
    Case("t3-c", ("3", "4"), ("C k=4", "variable TTL, k=4"), {"k": 4}),
    Case("t3-d", ("3",), ("D k=8",), {"k": 8}),
    Case(
        "t4-fixed",
        ("4",),
        ("fixed TTL 40, all addresses",),
        plain(40, 0.8),
    ),
)

TITLES = {
    "1": "Table 1: pause on overload, TTL 60 (plain DNS round-robin, every address)",
    "2": "Table 2: pause on overload, TTL 30",
    "3": "Table 3: variable TTL and weighted round-robin, k addresses per answer",
    "4": "Table 4: variable TTL + weighted RR (k=4) against a fixed 40 s TTL, every address",
}


@dataclass(frozen=True, slots=True)
class ExperimentPlan:
    """How every case is run."""

    out: Path
    case_duration: float = 240.0
    peak_users: int = 105
    think_time: float = 1.0
    ignore_ttl: float = 0.1
    max_servers: int = 4
    boot_delay: float = 10.0
    dns_port: int = 5300
    api_port: int = 8700
    http_port: int = 8080
    origin_port: int = 8000
    network: str = "127.0.1"

    @property
    def load(self) -> StepLoad:
        """6 steps of a seventh of the peak each, a step long, then the peak held a step."""
        every = self.case_duration / 8
        step = max(1, round(self.peak_users / 7))
        return StepLoad(start=step, step=step, every=every, count=6, hold=every)


def run_case(case: Case, plan: ExperimentPlan, say: Callable[[str], None]) -> CaseResult:
    """Run one case in a fresh lab; its files stay in ``plan.out / case.key``."""
    directory = plan.out / case.key
    policy = dataclasses.replace(PoolPolicy(), **case.policy)
    settings = LabSettings(
        workdir=directory / "lab",
        dns_port=plan.dns_port,
        api_port=plan.api_port,
        http_port=plan.http_port,
        origin_port=plan.origin_port,
        network=plan.network,
        boot_delay=plan.boot_delay,
        policy=policy,
        scaling=dataclasses.replace(
            default_scaling(), max_servers=plan.max_servers, boot_time=plan.boot_delay
        ),
    )
    lab = Lab(settings, say=lambda text: None)
    try:
        lab.start()
        test = LoadTest(
            dns_server=f"127.0.0.1:{plan.dns_port}",
            lb_name=settings.dns_name,
            http_port=plan.http_port,
            objects=settings.objects.count,
            load=plan.load,
            out=directory / "loadtest",
            think_time=plan.think_time,
            ignore_ttl=plan.ignore_ttl,
            seed=1,
            progress=0,
        )
        run_loadtest(test, quiet=True)
    finally:
        lab.stop(quiet=True)
    return write_report(
        load_run(settings.workdir, directory / "loadtest"), directory / "report", name=case.key
    )


def main(args: argparse.Namespace) -> int:
    """``dnslb experiments``."""
    wanted = set(args.tables.split(",")) if args.tables else set(TITLES)
    unknown = wanted - set(TITLES)
    if unknown:
        raise ConfigError("experiments", [f"--tables: no table {', '.join(sorted(unknown))}"])
    cases = [case for case in CASES if wanted & set(case.tables)]
    if args.cases:
        pattern = re.compile(args.cases)
        cases = [case for case in cases if pattern.search(case.key)]
    if not cases:
        raise ConfigError("experiments", ["no case selected"])
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(args.out) if args.out else default_workdir().parent / "experiments" / stamp
    plan = ExperimentPlan(
        out=out.resolve(),
        case_duration=args.case_duration,
        peak_users=args.peak_users,
        max_servers=args.max_servers,
        boot_delay=args.boot_delay,
        dns_port=args.dns_port,
        api_port=args.api_port,
        http_port=args.http_port,
        origin_port=args.origin_port,
    )
    load = plan.load
    print(
        f"dnslb experiments: {len(cases)} cases of {plan.case_duration:g} s each "
        f"({load.start} users, +{load.step} every {load.every:g} s up to {load.peak}); "
        f"1-{plan.max_servers} servers; results in {out}",
        flush=True,
    )
    started = time.monotonic()
    results: dict[str, CaseResult] = {}
    for number, case in enumerate(cases, 1):
        case_started = time.monotonic()
        result = run_case(case, plan, print)
        results[case.key] = result
        print(
            f"[{time.monotonic() - started:6.0f} s] {number}/{len(cases)} {case.key}: "
            f"{result.requests} requests, mean {result.mean_response:.3f} s, cost "
            f"{result.cost:.0f}, req/cost {result.requests_per_cost:.2f} "
            f"({time.monotonic() - case_started:.0f} s)",
            flush=True,
        )
    elapsed = time.monotonic() - started
    text, markdown = [], []
    for key, title in TITLES.items():
        rows = [
            dataclasses.replace(results[case.key], name=case.names[case.tables.index(key)])
            for case in cases
            if key in case.tables and case.key in results
        ]
        if rows:
            text.append(table(rows, title=title))
            markdown.append(f"### {title}\n\n{markdown_table(rows)}")
    footer = f"{len(cases)} cases in {elapsed / 60:.1f} min"
    print("\n" + "\n\n".join(text) + f"\n\n{footer}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.txt").write_text("\n\n".join(text) + f"\n\n{footer}\n")
    (out / "results.md").write_text("\n\n".join(markdown) + f"\n\n{footer}\n")
    (out / "results.json").write_text(
        json.dumps(
            {
                "elapsed_seconds": elapsed,
                "plan": {k: str(v) for k, v in dataclasses.asdict(plan).items()},
                "command": sys.argv,
                "cases": {key: result.as_dict() for key, result in results.items()},
            },
            indent=2,
        )
        + "\n"
    )
    return 0
