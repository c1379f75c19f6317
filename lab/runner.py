"""Running the lab: the origin, the manager (with its local cache servers), PowerDNS.

:class:`Lab` starts the lab's processes in order, each in a process group of its own and each
naming the lab's directory on its command line, waits until each one answers, and stops them
all: PowerDNS, then the manager (which stops the nginx cache servers and agents it launched),
then the origin, then anything else that still names the lab's directory (a cache server left
by a manager that was killed). While it runs, a thread samples the published plan every second
into ``plan-samples.jsonl`` for the report, and another keeps the manager's events and servers as
its REST API gives them (:mod:`lab.history`: ``events.jsonl``, ``servers.jsonl``).

``dnslb lab`` (:func:`run_lab`) shows progress while starting, prints where everything is, and
runs until Ctrl-C, SIGTERM or SIGHUP; ``--once`` shows a few answers and stops. The lab's
directory holds every file of a run (``lab.json`` says what runs where, for ``dnslb loadtest``
and ``dnslb report``); a new run empties it unless ``--keep-state``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO, Any

from daemons.pdns import PdnsServer, PdnsSettings
from daemons.process import (
    http_answers,
    kill_processes_mentioning,
    log_tail,
    port_free,
    processes_mentioning,
    spawn,
    stop_group,
)
from dnslb.config import checked, to_document
from dnslb.errors import ConfigError, DnslbError, PlanError, ProcessError
from dnslb.plan import Member, MemberState, Plan, parse_plan_json
from lab.history import ManagerApi, ManagerHistory
from lab.objects import ObjectCatalog
from lab.resolvers import Resolvers, resolver_addresses
from lab.settings import LabSettings, manager_config

LAB_FILE = "lab.json"
SAMPLES_FILE = "plan-samples.jsonl"
TOKEN_FILE = "api.token"  # noqa: S105 (a file name, not a token)


@dataclass(frozen=True, slots=True)
class LabInfo:
    """``lab.json``: where a lab's parts are, for the commands that load and measure it."""

    workdir: str
    pid: int
    started_at: float
    dns_address: str
    dns_port: int
    dns_name: str
    http_port: int
    network: str
    manager_url: str
    token_file: str
    objects: dict[str, int]
    settings: dict[str, Any]
    resolvers: list[str] = dataclasses.field(default_factory=list)
    """``ADDRESS:PORT`` of the lab's caching resolvers (empty: users ask pdns directly)."""

    def dns_servers(self, *, direct: bool = False) -> str:
        """What users of this lab ask: its resolvers (comma-separated), or its pdns when it runs
        none or ``direct``."""
        if self.resolvers and not direct:
            return ",".join(self.resolvers)
        return f"{self.dns_address}:{self.dns_port}"

    @property
    def catalog(self) -> ObjectCatalog:
        return ObjectCatalog(**self.objects)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2) + "\n"


def read_lab_info(workdir: str | os.PathLike[str]) -> LabInfo:
    """The ``lab.json`` of a lab directory; a :class:`ConfigError` when there is none."""
    path = Path(workdir) / LAB_FILE
    try:
        document = json.loads(path.read_text())
        return LabInfo(**document)
    except OSError as exc:
        raise ConfigError(
            "no lab", [f"{path}: cannot read ({exc.strerror}): has a lab run there?"]
        ) from None
    except (ValueError, TypeError) as exc:
        raise ConfigError("no lab", [f"{path}: not a lab description: {exc}"]) from None


class Lab:
    """The lab's processes. :meth:`start` them, :meth:`stop` them (always, even after an error).

    ``say`` receives progress lines. ``keep_state`` keeps the directory's state database, plan
    samples and results from the previous run instead of emptying the directory.
    """

    def __init__(
        self,
        settings: LabSettings,
        *,
        say: Callable[[str], None] = print,
        keep_state: bool = False,
    ) -> None:
        self.settings = settings
        self.workdir = settings.workdir.resolve()
        self.say = say
        self.keep_state = keep_state
        self.token_path = self.workdir / TOKEN_FILE
        self.plan_path = self.workdir / "plan.json"
        self.manager_log = self.workdir / "manager.log"
        self.origin_log = self.workdir / "origin.log"
        self.pdns: PdnsServer | None = None
        self.resolvers: Resolvers | None = None
        self.manager: subprocess.Popen[bytes] | None = None
        self.origin: subprocess.Popen[bytes] | None = None
        self.info: LabInfo | None = None
        self._lock: IO[str] | None = None
        self._sampler: threading.Thread | None = None
        self._recorder: threading.Thread | None = None
        self._sampling = threading.Event()
        self.history: ManagerHistory | None = None
        self.started_at = 0.0

    # -- starting -----------------------------------------------------------------------------

    def start(self, *, wait_for_server: bool = True) -> None:
        """Start everything; on any failure stop what was started and raise.

        With ``wait_for_server`` it returns once the first cache server is in DNS answers.
        """
        checked(self.settings, "invalid settings")
        self.started_at = time.monotonic()
        try:
            self._prepare_workdir()
            self._check_ports()
            self._write_config()
            self._start_origin()
            self._start_manager()
            self._start_pdns()
            self._start_resolvers()
            self._write_info()
            self._start_sampler()
            if wait_for_server:
                self._wait_for_first_server()
        except BaseException:
            self.stop(quiet=True)
            raise

    def _step(self, text: str) -> None:
        elapsed = time.monotonic() - self.started_at
        self.say(f"[{elapsed:5.1f} s] {text}")

    def _prepare_workdir(self) -> None:
        workdir = self.workdir
        workdir.mkdir(parents=True, exist_ok=True)
        lock = open(workdir / ".lock", "a+")  # noqa: SIM115 (held for the lab's life)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            owner = _lab_pid(workdir)
            raise ProcessError(
                f"another lab runs in {workdir}{f' (pid {owner})' if owner else ''}: stop it "
                "(Ctrl-C there), or give this one its own --workdir and ports"
            ) from None
        self._lock = lock
        left = kill_processes_mentioning(f"{workdir}/")
        if left:
            self._step(f"stopped {len(left)} processes left in {workdir} by an earlier lab")
        entries = [p for p in workdir.iterdir() if p.name != ".lock"]
        if entries and not (workdir / LAB_FILE).exists() and not self.keep_state:
            raise ConfigError(
                "lab",
                [
                    f"--workdir {workdir}: not empty and not a lab's directory (no {LAB_FILE}); "
                    "refusing to empty it"
                ],
            )
        if self.keep_state:
            # The processes' own files go; the state database, samples and results stay.
            for name in (LAB_FILE, "plan.json", TOKEN_FILE, "pdns", "providers"):
                _remove(workdir / name)
        else:
            for entry in entries:
                _remove(entry)
        self._step(f"lab directory {workdir}{' (state kept)' if self.keep_state else ''}")

    def _check_ports(self) -> None:
        settings = self.settings
        problems = []
        for option, port, kinds in (
            ("--dns-port", settings.dns_port, ("udp", "tcp")),
            ("--api-port", settings.api_port, ("tcp",)),
            ("--origin-port", settings.origin_port, ("tcp",)),
        ):
            busy = [kind for kind in kinds if not port_free("127.0.0.1", port, kind)]
            if busy:
                problems.append(
                    f"{option} {port}: 127.0.0.1:{port} is in use ({'/'.join(busy)}); "
                    f"choose another port with {option}"
                )
        for address in resolver_addresses(settings.resolver_network, settings.resolvers):
            busy = [k for k in ("udp", "tcp") if not port_free(address, settings.dns_port, k)]
            if busy:
                problems.append(
                    f"--resolvers: {address}:{settings.dns_port} is in use ({'/'.join(busy)}); "
                    "choose another --resolver-network or --dns-port"
                )
        first = f"{settings.network}.1"
        if not port_free(first, settings.http_port, "tcp"):
            problems.append(
                f"--http-port {settings.http_port}: {first}:{settings.http_port} is in use "
                "(another lab's cache server?); choose another --http-port or --network"
            )
        if problems:
            raise ConfigError("cannot start", problems)

    def _write_config(self) -> None:
        # A new token every run, readable by its owner only; the config names the file.
        _write_private(self.token_path, secrets.token_urlsafe(32) + "\n")
        (self.workdir / "manager.yaml").write_text(
            manager_config(self.settings, api_token_file=self.token_path)
        )

    def _python(self) -> list[str]:
        # -P: the lab's directory (the children's cwd) never shadows our modules.
        return [sys.executable, "-P", "-m", "cli"]

    def _spawn(
        self, command: list[str], log_path: Path, name: str, url: str
    ) -> subprocess.Popen[bytes]:
        """Start a child of the lab and wait until ``url`` answers."""
        return spawn(
            command,
            name=f"the {name}",
            ready=lambda _: http_answers(url),
            log=log_path,
            timeout=20.0,
            cwd=self.workdir,
        )

    def _start_origin(self) -> None:
        settings = self.settings
        objects = settings.objects
        self.origin = self._spawn(
            [
                *self._python(),
                "origin",
                "--address",
                "127.0.0.1",
                "--port",
                str(settings.origin_port),
                "--objects",
                str(objects.count),
                "--mean-size",
                str(objects.mean_size),
                "--min-size",
                str(objects.min_size),
                "--max-age",
                str(settings.max_age),
                "--pid-file",
                str(self.workdir / "origin.pid"),
            ],
            self.origin_log,
            "origin",
            f"{settings.origin_url}/healthz",
        )
        self._step(f"origin answers on {settings.origin_url} ({objects.count} objects)")

    def _start_manager(self) -> None:
        config = self.workdir / "manager.yaml"
        self.manager = self._spawn(
            [*self._python(), "manager", "--config", str(config)],
            self.manager_log,
            "manager",
            f"{self.settings.manager_url}/healthz",
        )
        deadline = time.monotonic() + 15
        while not self.plan_path.exists():
            if self.manager.poll() is not None or time.monotonic() > deadline:
                raise ProcessError(
                    f"the manager published no plan:\n{log_tail(self.manager_log, 30)}"
                )
            time.sleep(0.1)
        self._step(f"manager answers on {self.settings.manager_url}; plan {self.plan_path}")

    def _start_pdns(self) -> None:
        settings = self.settings
        self.pdns = PdnsServer(
            PdnsSettings(plan=str(self.plan_path), port=settings.dns_port), self.workdir / "pdns"
        )
        self.pdns.start(probe_name=settings.zone)
        self._step(f"PowerDNS answers on 127.0.0.1:{settings.dns_port} (pipe backend)")

    def _start_resolvers(self) -> None:
        settings = self.settings
        if not settings.resolvers:
            return
        self.resolvers = Resolvers(
            self.workdir / "resolvers",
            count=settings.resolvers,
            network=settings.resolver_network,
            port=settings.dns_port,
            zone=settings.zone,
            upstream_port=settings.dns_port,
            rrset_roundrobin=settings.rrset_roundrobin,
        )
        self.resolvers.start()
        self._step(
            f"{settings.resolvers} unbound resolvers answer on {settings.resolver_network}.1-"
            f"{settings.resolvers}:{settings.dns_port} (rrset-roundrobin "
            f"{'on' if settings.rrset_roundrobin else 'off'})"
        )

    def _write_info(self) -> None:
        settings = self.settings
        document = to_document(dataclasses.replace(settings, workdir=Path()))
        document.pop("workdir", None)
        self.info = LabInfo(
            workdir=str(self.workdir),
            pid=os.getpid(),
            started_at=time.time(),
            dns_address="127.0.0.1",
            dns_port=settings.dns_port,
            dns_name=settings.dns_name,
            http_port=settings.http_port,
            network=settings.network,
            manager_url=settings.manager_url,
            token_file=str(self.token_path),
            objects=dataclasses.asdict(settings.objects),
            settings=document,
            resolvers=self.resolvers.servers if self.resolvers is not None else [],
        )
        (self.workdir / LAB_FILE).write_text(self.info.to_json())

    def _wait_for_first_server(self) -> None:
        settings = self.settings
        self._step(
            f"waiting for the first cache server (the local provider boots it after "
            f"{settings.boot_delay:g} s)"
        )
        deadline = time.monotonic() + settings.boot_delay + 60
        while time.monotonic() < deadline:
            self.check_running()
            serving = self.serving()
            if serving:
                # In the plan now; every pipe backend reads it within its poll interval
                # (0.25 s). A query answered meanwhile by one that has not would be a
                # "no such name" that pdns then keeps for negquery-cache-ttl: wait it out.
                time.sleep(1.0)
                self._step(
                    f"cache server {serving[0]}:{settings.http_port} is in the answers for "
                    f"{settings.dns_name}"
                )
                return
            time.sleep(0.25)
        raise ProcessError(
            "no cache server came up in time; the manager's log ends:\n"
            + log_tail(self.manager_log, 30)
        )

    def serving(self) -> list[str]:
        """Addresses of the pool's active members in the published plan (empty until one)."""
        plan = _read_plan(self.plan_path)
        if plan is None:
            return []
        for pool in plan.pools:
            if pool.name == self.settings.dns_name:
                return [m.address for m in pool.members if m.state is MemberState.ACTIVE]
        return []

    # -- running ------------------------------------------------------------------------------

    def check_running(self) -> None:
        """Raise :class:`ProcessError` (with its log's end) if a part of the lab has exited."""
        for name, process, log in (
            ("origin", self.origin, self.origin_log),
            ("manager", self.manager, self.manager_log),
            ("PowerDNS", self.pdns.process if self.pdns else None, self.pdns_log),
        ):
            if process is not None and process.poll() is not None:
                raise ProcessError(
                    f"the {name} exited with status {process.returncode}; its log ends:\n"
                    + log_tail(log, 30)
                )

    @property
    def marker(self) -> str:
        """What every process of this lab has on its command line: the directory, with a slash."""
        return f"{self.workdir}/"

    @property
    def pdns_log(self) -> Path:
        return self.workdir / "pdns" / "pdns.log"

    def _start_sampler(self) -> None:
        self._sampling.clear()
        self._sampler = threading.Thread(target=self._sample, name="plan sampler", daemon=True)
        self._sampler.start()
        api = ManagerApi(self.settings.manager_url, self.token_path.read_text().strip())
        self.history = ManagerHistory(api, self.workdir)
        self._recorder = threading.Thread(
            target=self._record, args=(self.history,), name="manager history", daemon=True
        )
        self._recorder.start()

    def _record(self, history: ManagerHistory) -> None:
        """Keep the manager's new events and servers every interval (a failed call: next time)."""
        while not self._sampling.wait(self.settings.sample_interval):
            with contextlib.suppress(ProcessError):
                history.poll()

    def _stop_sampler(self) -> None:
        """Stop sampling; the manager still runs: keep its last events."""
        self._sampling.set()
        for thread in (self._sampler, self._recorder):
            if thread is not None:
                thread.join(5)
        self._sampler = self._recorder = None
        history, self.history = self.history, None
        if history is not None and self.manager is not None and self.manager.poll() is None:
            with contextlib.suppress(ProcessError):
                history.poll()

    def _sample(self) -> None:
        """Append the pool's members, as published, to the samples file every interval, each
        with its utilization as the manager has it now: the plan carries a pool again only when
        its answers change (docs/plan.md), so its utilizations can be old; its states, weights
        and TTLs are what DNS answers."""
        path = self.workdir / SAMPLES_FILE
        name = self.settings.dns_name
        api = ManagerApi(self.settings.manager_url, self.token_path.read_text().strip())
        last_stat: tuple[int, int] | None = None
        plan: Plan | None = None
        with open(path, "a") as out:
            while not self._sampling.wait(self.settings.sample_interval):
                try:
                    stat = self.plan_path.stat()
                    key = (stat.st_mtime_ns, stat.st_ino)
                except OSError:
                    continue
                if key != last_stat:
                    plan = _read_plan(self.plan_path) or plan
                    last_stat = key
                if plan is None:
                    continue
                measured = _utilizations(api)
                members = [
                    _sampled(m, measured.get(m.id, m.utilization))
                    for pool in plan.pools
                    if pool.name == name
                    for m in pool.members
                ]
                line = {"t": round(time.time(), 3), "version": plan.version, "members": members}
                out.write(json.dumps(line, separators=(",", ":")) + "\n")
                out.flush()

    # -- stopping -----------------------------------------------------------------------------

    def stop(self, *, quiet: bool = False) -> list[int]:
        """Stop everything (idempotent); returns the pids of stragglers that had to be killed.

        Raises :class:`ProcessError` only if a process survives SIGKILL.
        """
        say: Callable[[str], None] = (lambda text: None) if quiet else self._step
        self._stop_sampler()
        resolvers, self.resolvers = self.resolvers, None
        if resolvers is not None:
            resolvers.stop()
            say("resolvers stopped")
        if self.pdns is not None:
            self.pdns.stop()
            self.pdns = None
            say("PowerDNS stopped")
        manager, self.manager = self.manager, None
        if manager is not None:
            # SIGTERM: the manager stops the cache servers it launched, then itself.
            stop_group(manager, sig=signal.SIGTERM, timeout=40)
            say(f"manager stopped (status {manager.returncode}) with its cache servers")
        origin, self.origin = self.origin, None
        if origin is not None:
            stop_group(origin, sig=signal.SIGTERM, timeout=5)
            say("origin stopped")
        stragglers: list[int] = []
        if self.workdir.is_dir():
            stragglers = kill_processes_mentioning(self.marker)
            if stragglers:
                say(f"killed {len(stragglers)} processes still naming {self.workdir}")
            left = processes_mentioning(self.marker)
            if left:
                raise ProcessError(f"processes {left} of the lab survive")
        if self._lock is not None:
            self._lock.close()
            self._lock = None
        return stragglers

    def __enter__(self) -> Lab:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- helpers ----------------------------------------------------------------------------------


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to a file only its owner can read (created 0600, never wider)."""
    path.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(text)


def _lab_pid(workdir: Path) -> int | None:
    try:
        return int(json.loads((workdir / LAB_FILE).read_text())["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _read_plan(path: Path) -> Plan | None:
    try:
        return parse_plan_json(path.read_bytes())
    except (OSError, PlanError):
        return None


# -- the command ------------------------------------------------------------------------------


def run_lab(settings: LabSettings, *, keep_state: bool = False, once: bool = False) -> int:
    """``dnslb lab``: run the lab until interrupted (or, with ``once``, show a few answers and
    stop); returns the exit status. ``keep_state``: as :class:`Lab`'s."""
    lab = Lab(settings, say=_say, keep_state=keep_state)
    with interrupts():
        try:
            _say(f"dnslb lab: starting in {lab.workdir}")
            lab.start()
            _show_answers(settings)
            if once:
                return 0
            _say(where(lab))
            while True:
                lab.check_running()
                time.sleep(0.5)
        except KeyboardInterrupt:
            _say("\nstopping the lab")
            return 0
        except DnslbError as exc:
            print(f"dnslb lab: {exc}", file=sys.stderr, flush=True)
            return 1
        finally:
            with interrupts(ignore=True):
                lab.stop()
            left = processes_mentioning(lab.marker)
            _say(
                "stopped: no process of the lab is left"
                if not left
                else f"WARNING: processes {left} of the lab are still running"
            )


@contextlib.contextmanager
def interrupts(*, ignore: bool = False) -> Iterator[None]:
    """SIGTERM and SIGHUP stop the lab as Ctrl-C does; with ``ignore``, none of them interrupts
    (while the lab stops: a second Ctrl-C must not leave processes behind)."""
    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {signum: signal.getsignal(signum) for signum in signals}
    handler: Any = signal.SIG_IGN if ignore else _interrupt
    for signum in signals:
        signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _say(text: str) -> None:
    print(text, flush=True)


def where(lab: Lab) -> str:
    """Where everything is, for the operator."""
    settings = lab.settings
    work = lab.workdir
    url = settings.manager_url
    scaling = settings.scaling
    lines = [
        "",
        "The lab is up. Where everything is:",
        f"  DNS            127.0.0.1:{settings.dns_port}, load-balanced name {settings.dns_name}",
        f"                 dig @127.0.0.1 -p {settings.dns_port} {settings.dns_name}",
        f"  cache servers  {settings.network}.N:{settings.http_port} (nginx + agent each), "
        f"{scaling.min_servers} to {scaling.max_servers}, booting in {settings.boot_delay:g} s",
        f"                 curl http://{settings.network}.1:{settings.http_port}/objects/0",
        f"  origin         {settings.origin_url}/objects/0 .. "
        f"/objects/{settings.objects.count - 1}",
        f"  manager        {url} (agents report to it)",
    ]
    token = lab.token_path.read_text().strip()
    lines += [
        f"  dashboard      {url}/dashboard/  (paste the token when asked)",
        f"  REST API       {url}/v1/status",
        f"                 dnslb ctl --url {url} --token-file {lab.token_path} status",
        f"  metrics        {url}/metrics",
        f"  token          {token}",
        f"                 (admin; kept in {lab.token_path}, mode 0600; new every run)",
        f'                 curl -H "Authorization: Bearer $(cat {lab.token_path})" {url}/v1/status',
    ]
    lines += [
        f"  files          {work}/",
        "                 manager.yaml, manager.log, state.db, plan.json, plan-samples.jsonl,",
        "                 events.jsonl, servers.jsonl (the manager's, through its API),",
        "                 origin.log, pdns/pdns.log, providers/<pool>/<server>/ (nginx, agent)",
        "",
        "Load it and measure it (from another terminal):",
        f"  dnslb loadtest --lab {work} --start-users 20 --step-users 20 --steps 5 --step-time 30",
        f"  dnslb report --lab {work}",
        "",
        "Ctrl-C stops everything.",
    ]
    return "\n".join(lines)


def _show_answers(settings: LabSettings) -> None:
    import dns.message  # noqa: PLC0415
    import dns.query  # noqa: PLC0415
    import dns.rcode  # noqa: PLC0415

    zone = settings.zone
    name = settings.dns_name
    questions = [(name, "A")] * 3 + [(zone, "SOA"), (f"no-such-name.{zone}", "A")]
    _say(f"\nAnswers from 127.0.0.1:{settings.dns_port}:")
    for qname, rtype in questions:
        reply = dns.query.udp(
            dns.message.make_query(qname, rtype), "127.0.0.1", port=settings.dns_port, timeout=2
        )
        if not reply.answer:
            _say(f"  {qname:<24} {rtype:<4} {dns.rcode.to_text(reply.rcode())}")
            continue
        for rrset in reply.answer:
            data = " ".join(str(rdata) for rdata in rrset)
            _say(f"  {qname:<24} {rtype:<4} ttl={rrset.ttl:<4} {data}")


def _sampled(member: Member, utilization: float | None) -> list[object]:
    """A sample's member: id, address, state, weight and TTL as DNS answers, utilization now."""
    return [member.id, member.address, member.state.value, utilization, member.weight, member.ttl]


def _utilizations(api: ManagerApi) -> dict[str, float]:
    """Each server's smoothed utilization as the manager has it now (empty when the API does
    not answer: the plan's then)."""
    try:
        servers = api.get("/v1/servers")
        return {
            str(item["id"]): float(item["utilization"])
            for item in servers
            if isinstance(item, dict) and isinstance(item.get("utilization"), int | float)
        }
    except (ProcessError, KeyError, TypeError, ValueError):
        return {}
