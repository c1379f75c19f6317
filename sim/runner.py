"""``dnslb sim``: run scenario files or a suite of them, print the tables, write results and plots.

Runs are independent, so they go to worker processes (``--jobs``, the CPU count by default);
every run is seeded by itself, so the figures do not depend on how many workers ran them.
Identical cases in several tables (table 3's k=4 is table 4's product case) run once.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from evaluation.columns import markdown_table, table
from sim.engine import Simulation
from sim.metrics import RunResult
from sim.scenario import SCENARIO_DIR, Scenario, ScenarioFile, load_scenarios

SUITES: dict[str, tuple[str, ...]] = {
    "paper": (
        "paper-table1.yaml",
        "paper-table2.yaml",
        "paper-table3.yaml",
        "paper-table4.yaml",
    ),
    "goals": (
        "goals-round-robin.yaml",
        "goals-round-robin-hot.yaml",
        "goals-fixed-ttl.yaml",
        "goals-flash-crowd.yaml",
        "step-load.yaml",
    ),
    "scenarios": ("step-load.yaml", "flash-crowd.yaml", "failure.yaml", "plain-round-robin.yaml"),
    "faults": ("faults.yaml",),
}
"""Named sets of the shipped scenario files (``dnslb sim --suite NAME``)."""


@dataclass(frozen=True, slots=True)
class Job:
    """One run to do: a case, its seed, and where its files go (None: nowhere)."""

    scenario: Scenario
    seed: int
    out: Path | None
    plots: bool


def run_job(job: Job) -> RunResult:
    """Run one case and write its ``result.json`` and plots (in a worker process)."""
    simulation = Simulation(job.scenario, job.seed)
    result = simulation.run()
    if job.out is not None:
        job.out.mkdir(parents=True, exist_ok=True)
        (job.out / "result.json").write_text(json.dumps(result.as_dict(), indent=2) + "\n")
        if job.plots:
            from evaluation.plots import write_plots  # noqa: PLC0415

            write_plots(simulation.series(), job.out, job.scenario.name)
    return result


def average(results: Sequence[RunResult]) -> RunResult:
    """The mean of each figure over runs of one case (the paper averaged 5 runs per case)."""
    first = results[0]
    if len(results) == 1:
        return first
    values: dict[str, object] = {}
    for item in dataclasses.fields(RunResult):
        column = [getattr(result, item.name) for result in results]
        if item.name in ("name", "seed"):
            values[item.name] = column[0]
        elif isinstance(column[0], int):
            values[item.name] = round(sum(column) / len(column))
        else:
            values[item.name] = sum(column) / len(column)
    return RunResult(**values)  # type: ignore[arg-type]


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "case"


def run_files(
    files: Sequence[ScenarioFile],
    *,
    seed: int | None,
    repeat: int,
    out: Path | None,
    jobs: int,
    plots: bool,
) -> list[tuple[ScenarioFile, list[RunResult]]]:
    """Run every case of ``files`` ``repeat`` times (seeds ``seed``, ``seed + 1``...; the
    scenario's own seed when ``seed`` is None); returns the averaged results per file."""
    work: dict[tuple[Scenario, int], Job] = {}
    keys: list[list[list[tuple[Scenario, int]]]] = []
    for file in files:
        file_keys = []
        for scenario in file.scenarios:
            case_keys = []
            base = scenario.seed if seed is None else seed
            for offset in range(repeat):
                run_seed = base + offset
                unnamed = dataclasses.replace(scenario, name="", description=None)
                key = (unnamed, run_seed)
                case_keys.append(key)
                if key not in work:
                    target = None
                    if out is not None:
                        target = out / slug(Path(file.path).stem) / slug(scenario.name)
                        if repeat > 1:
                            target = target / f"seed-{run_seed}"
                    work[key] = Job(scenario=scenario, seed=run_seed, out=target, plots=plots)
            file_keys.append(case_keys)
        keys.append(file_keys)
    ordered = list(work)
    if jobs > 1 and len(ordered) > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            done = dict(zip(ordered, pool.map(run_job, [work[k] for k in ordered]), strict=True))
    else:
        done = {key: run_job(work[key]) for key in ordered}
    report = []
    for file, file_keys in zip(files, keys, strict=True):
        rows = []
        for scenario, case_keys in zip(file.scenarios, file_keys, strict=True):
            rows.append(
                dataclasses.replace(average([done[key] for key in case_keys]), name=scenario.name)
            )
        report.append((file, rows))
    return report


def locations(rows: Sequence[RunResult]) -> list[str]:
    """For scenarios with locations: the share of requests served in the user's location, and
    the failed requests that were not in progress on a crashed server."""
    lines = [
        f"  {row.name}: {row.in_location:.1%} served in the client's location; "
        f"{row.failed - row.failed_on_crash} failed besides those on crashed servers"
        for row in rows
        if not math.isnan(row.in_location)
    ]
    return ["locations:", *lines] if lines else []


def checks(rows: Sequence[RunResult]) -> str:
    """What must never happen, per case: requests failed on servers the manager terminated
    (a drain that ended too early), servers running that it does not know, double launches."""
    lines = []
    for row in rows:
        found = [
            f"{count} {what}"
            for count, what in (
                (row.failed_on_termination, "requests failed on servers it terminated"),
                (row.sent_to_terminated, "connections to servers it terminated"),
                (row.orphans, "servers left running unknown"),
                (row.double_launches, "servers launched twice"),
            )
            if count
        ]
        if found:
            lines.append(f"  {row.name}: {'; '.join(found)}")
    if not lines:
        return (
            "checks: no case failed a request by a termination, sent a client to a terminated "
            "server, left a server running unknown or launched one twice"
        )
    return "checks FAILED (each should be 0):\n" + "\n".join(lines)


def scenario_path(name: str) -> Path:
    """A scenario file by path, or by the name of a shipped one (``step-load``)."""
    path = Path(name)
    if path.is_file():
        return path
    if path.suffix in (".yaml", ".yml"):
        return SCENARIO_DIR / path.name
    return SCENARIO_DIR / f"{name}.yaml"  # a shipped name, even beside a directory of that name


def main(
    scenarios: Sequence[str] = (),
    *,
    suite: str | None = None,
    seed: int | None = None,
    repeat: int = 1,
    out: str | None = None,
    jobs: int = 0,
    plots: bool = True,
) -> int:
    """The ``dnslb sim`` command: run ``scenarios`` (files or shipped names) and the ``suite``,
    print the paper's table of each, and write results (and plots) to ``out``."""
    names: list[str] = list(scenarios)
    if suite:
        if suite not in SUITES:
            print(
                f"dnslb sim: unknown suite {suite!r} (one of {', '.join(SUITES)})",
                file=sys.stderr,
            )
            return 2
        names += list(SUITES[suite])
    if not names:
        print("dnslb sim: give scenario files or --suite", file=sys.stderr)
        return 2
    files = [load_scenarios(scenario_path(name)) for name in names]
    directory = Path(out) if out else None
    started = time.perf_counter()
    report = run_files(
        files,
        seed=seed,
        repeat=repeat,
        out=directory,
        jobs=jobs or os.cpu_count() or 1,
        plots=directory is not None and plots,
    )
    elapsed = time.perf_counter() - started
    text = []
    markdown = []
    for file, rows in report:
        text.append("\n".join([table(rows, title=file.title), *locations(rows), checks(rows)]))
        markdown.append(f"### {file.title}\n\n{markdown_table(rows)}")
    runs = sum(len(file.scenarios) for file in files) * repeat
    footer = f"{runs} runs in {elapsed:.1f} s"
    print("\n\n".join(text))
    print(footer, file=sys.stderr)
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "results.txt").write_text("\n\n".join(text) + "\n")
        (directory / "results.md").write_text("\n\n".join(markdown) + "\n")
        results = [
            {"file": file.path, "title": file.title, "cases": [row.as_dict() for row in rows]}
            for file, rows in report
        ]
        (directory / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    return 0
