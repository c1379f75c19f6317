"""``dnslb loadtest``: a headless locust run against a lab, with CSV output.

It reads the lab's ``lab.json`` (DNS server, load-balanced name, cache servers' port, objects),
runs ``locust -f lab/loadtest/locustfile.py --headless`` with the step load asked for, and leaves in
its output directory: ``locust_stats.csv``, ``locust_stats_history.csv``, ``locust_failures.csv``
and ``locust_exceptions.csv`` (locust's own), ``requests.csv`` (every request,
:mod:`lab.records`), ``loadtest.json`` (the parameters, start and end) and ``locust.log``.
``dnslb report`` reads them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from dnslb.errors import ConfigError, ProcessError
from lab.loadtest.shape import StepLoad
from lab.records import read_records
from lab.runner import default_workdir, read_lab_info

LOCUSTFILE = Path(__file__).resolve().parent / "locustfile.py"
RUN_FILE = "loadtest.json"
RECORDS_FILE = "requests.csv"
CSV_PREFIX = "locust"


@dataclass(frozen=True, slots=True)
class LoadTest:
    """One headless run: where to send the load, its shape, the users' behaviour."""

    dns_server: str  # HOST:PORT
    lb_name: str
    http_port: int
    objects: int
    load: StepLoad
    out: Path
    think_time: float = 1.0
    ignore_ttl: float = 0.1
    ignore_ttl_hold: float = 600.0
    connect: str = "first"
    request_timeout: float = 60.0
    seed: int | None = None
    progress: float = 10.0

    def problems(self) -> list[str]:
        found = list(self.load.problems())
        if not 0 <= self.ignore_ttl <= 1:
            found.append(f"--ignore-ttl {self.ignore_ttl:g}: must be a fraction from 0 to 1")
        if self.think_time < 0:
            found.append(f"--think-time {self.think_time:g}: must be 0 or more")
        if self.request_timeout <= 0:
            found.append(f"--request-timeout {self.request_timeout:g}: must be above 0")
        if self.connect not in ("first", "random"):
            found.append(f"--connect {self.connect!r}: first or random")
        return found

    def command(self) -> list[str]:
        """The locust command line of this run."""
        load = self.load
        command = [
            sys.executable,
            "-m",
            "locust",
            "-f",
            str(LOCUSTFILE),
            "--headless",
            "--only-summary",
            "--csv",
            str(self.out / CSV_PREFIX),
            "--logfile",
            str(self.out / "locust.log"),
            "--loglevel",
            "WARNING",
            "--exit-code-on-error",
            "0",
            "--dns-server",
            self.dns_server,
            "--lb-name",
            self.lb_name,
            "--http-port",
            str(self.http_port),
            "--objects",
            str(self.objects),
            "--think-time",
            str(self.think_time),
            "--ignore-ttl",
            str(self.ignore_ttl),
            "--ignore-ttl-hold",
            str(self.ignore_ttl_hold),
            "--connect",
            self.connect,
            "--request-timeout",
            str(self.request_timeout),
            "--records",
            str(self.out / RECORDS_FILE),
            "--start-users",
            str(load.start),
            "--step-users",
            str(load.step),
            "--step-time",
            str(load.every),
            "--steps",
            str(load.count),
            "--hold",
            str(load.hold),
            "--progress",
            str(self.progress),
        ]
        if self.seed is not None:
            command += ["--seed", str(self.seed)]
        return command


def run_loadtest(test: LoadTest, *, quiet: bool = False) -> Path:
    """Run ``test`` to its end (locust stops when the shape ends); returns its output directory.

    Raises :class:`ConfigError` for bad parameters and :class:`ProcessError` when locust fails
    or writes no records.
    """
    problems = test.problems()
    if problems:
        raise ConfigError("loadtest", problems)
    test.out.mkdir(parents=True, exist_ok=True)
    (test.out / RECORDS_FILE).unlink(missing_ok=True)
    started = time.time()
    run = {
        "started_at": started,
        "ended_at": None,
        "test": {
            key: (str(value) if isinstance(value, Path) else value)
            for key, value in dataclasses.asdict(test).items()
        },
        "command": test.command(),
    }
    (test.out / RUN_FILE).write_text(json.dumps(run, indent=2) + "\n")
    stdout = subprocess.DEVNULL if quiet else None
    # Limit on how long locust may take beyond the shape's end (it stops users, writes CSVs).
    timeout = test.load.duration + test.request_timeout + 60
    with open(test.out / "locust.out", "ab") as output:
        process = subprocess.Popen(
            test.command(),
            stdin=subprocess.DEVNULL,
            stdout=stdout if stdout is not None else None,
            stderr=output,
        )
        try:
            status = process.wait(timeout)
        except BaseException:
            process.terminate()
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            raise
    run["ended_at"] = time.time()
    run["exit_status"] = status
    (test.out / RUN_FILE).write_text(json.dumps(run, indent=2) + "\n")
    if status != 0:
        errors = (test.out / "locust.out").read_text(errors="replace")[-2000:]
        raise ProcessError(f"locust exited with status {status}:\n{errors}")
    if not (test.out / RECORDS_FILE).exists():
        raise ProcessError(f"locust wrote no {RECORDS_FILE} in {test.out}")
    return test.out


def summary(out: Path) -> str:
    """One paragraph on a finished run's records."""
    http = dns = failed = 0
    total = 0.0
    for record in read_records(out / RECORDS_FILE):
        if record.is_dns:
            dns += 1
        elif record.ok:
            http += 1
            total += record.seconds
        else:
            failed += 1
    mean = total / http if http else 0.0
    return (
        f"{http} requests served (mean {mean:.3f} s), {failed} failed, {dns} DNS lookups; "
        f"results in {out}"
    )


def main(args: argparse.Namespace) -> int:
    """``dnslb loadtest``."""
    lab_dir = Path(args.lab) if args.lab else default_workdir()
    info = read_lab_info(lab_dir)
    load = StepLoad(
        start=args.start_users,
        step=args.step_users,
        every=args.step_time,
        count=args.steps,
        hold=args.hold,
    )
    out = (
        Path(args.out)
        if args.out
        else Path(info.workdir) / "loadtest" / time.strftime("%Y%m%d-%H%M%S")
    )
    test = LoadTest(
        dns_server=f"{info.dns_address}:{info.dns_port}",
        lb_name=info.dns_name,
        http_port=info.http_port,
        objects=info.catalog.count,
        load=load,
        out=out,
        think_time=args.think_time,
        ignore_ttl=args.ignore_ttl,
        ignore_ttl_hold=args.ignore_ttl_hold,
        connect=args.connect,
        request_timeout=args.request_timeout,
        seed=args.seed,
    )
    print(
        f"dnslb loadtest: {load.start} users, +{load.step} every {load.every:g} s "
        f"({load.count} steps, peak {load.peak}), held {load.hold:g} s: "
        f"{load.duration:.0f} s against {info.dns_name} via {test.dns_server}",
        flush=True,
    )
    run_loadtest(test)
    print(summary(out))
    print(f"report:  dnslb report --lab {info.workdir} --loadtest {out}")
    return 0
