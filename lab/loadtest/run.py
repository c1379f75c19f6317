"""``dnslb loadtest``: a headless locust run against a lab, with CSV output.

:func:`run_loadtest` runs ``locust -f lab/loadtest/locustfile.py --headless`` as a :class:`LoadTest`
says (``dnslb loadtest`` fills one from the lab's ``lab.json``: DNS server, load-balanced name,
cache servers' port, objects), and leaves in its output directory: ``locust_stats.csv``,
``locust_stats_history.csv``, ``locust_failures.csv`` and ``locust_exceptions.csv`` (locust's own),
``requests.csv`` (every request, :mod:`lab.records`), ``loadtest.json`` (the parameters, start and
end) and ``locust.log``. ``dnslb report`` reads them.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from dnslb.config import checked, default_of, setting
from dnslb.errors import ProcessError
from lab.loadtest.shape import StepLoad
from lab.objects import ObjectCatalog
from lab.records import read_records
from lab.settings import LAB_POOL, LAB_ZONE, LabSettings

LOCUSTFILE = Path(__file__).resolve().parent / "locustfile.py"
RUN_FILE = "loadtest.json"
RECORDS_FILE = "requests.csv"
CSV_PREFIX = "locust"


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadTest:
    """One headless run: where to send the load, its shape, the users' behaviour.

    The defaults are a default lab's (``dnslb lab`` with no options) and the paper's clients'.
    """

    out: Path = setting(help="output directory: locust's CSVs, requests.csv, loadtest.json")
    dns_server: str = setting(
        f"127.0.0.1:{default_of(LabSettings, 'dns_port')}",
        help="ADDRESS:PORT (or NAME:PORT) of the DNS server users ask; several, "
        "comma-separated: user N asks the N-th (modulo), as behind the lab's resolvers",
    )
    lb_name: str = setting(f"{LAB_POOL}.{LAB_ZONE}", help="the load-balanced name")
    http_port: int = setting(
        default_of(LabSettings, "http_port"), help="cache servers' port", min=1, max=65535
    )
    objects: int = setting(
        default_of(ObjectCatalog, "count"), help="objects /objects/0..N-1", min=1
    )
    load: StepLoad = setting(default_factory=StepLoad, help="the step load")
    think_time: float = setting(1.0, help="mean think time, seconds", min=0)
    user_cache: bool = setting(
        True, help="each user keeps an answer for its TTL (False: asks before every request)"
    )
    ignore_ttl: float = setting(
        0.1, help="fraction of users ignoring TTLs, as some real clients do", min=0, max=1
    )
    ignore_ttl_hold: float = setting(
        600.0, help="seconds a TTL-ignoring user keeps an answer", min=0
    )
    connect: Literal["first", "random"] = setting(
        "first", help="the address of an answer a user connects to"
    )
    request_timeout: float = setting(
        60.0, help="seconds after which a user gives up on a request (above 0)", min=0
    )
    seed: int | None = setting(None, help="seed of the users' random choices")
    progress: float = setting(10.0, help="seconds between progress lines (0: none)", min=0)

    def config_problems(self) -> Iterator[str]:
        if self.request_timeout <= 0:
            yield f"request_timeout: must be above 0, not {self.request_timeout:g}"
        for server in self.dns_server.split(","):
            if not server.rpartition(":")[2].isdigit():
                yield f"dns_server: {server!r} is not ADDRESS:PORT"
        if self.connect not in ("first", "random"):
            yield f"connect: must be first or random, not {self.connect!r}"

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
            "--user-cache" if self.user_cache else "--no-user-cache",
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
    checked(test, "loadtest")
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


def describe(test: LoadTest) -> str:
    """One line on what ``test`` will do."""
    load = test.load
    return (
        f"{load.start} users, +{load.step} every {load.every:g} s "
        f"({load.count} steps, peak {load.peak}), held {load.hold:g} s: "
        f"{load.duration:.0f} s against {test.lb_name} via {test.dns_server}"
    )
