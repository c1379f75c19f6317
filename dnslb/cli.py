"""The ``dnslb`` command: one entry point, a subcommand per process or task.

Each subcommand imports what it needs only when it runs, so ``dnslb pipe-backend`` starts with the
standard library and the core alone. An expected error (:class:`~dnslb.errors.DnslbError`) becomes
one clear message on stderr and exit status 1; usage errors exit 2.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from dnslb import __version__
from dnslb.errors import DnslbError

if TYPE_CHECKING:
    from dnslb.fuzzing import Harness
    from manager.service import Manager

Handler = Callable[[argparse.Namespace], int]
log = logging.getLogger("dnslb")


def _plan_check(args: argparse.Namespace) -> int:
    from dnslb.errors import PlanError  # noqa: PLC0415
    from dnslb.plan import parse_plan_json  # noqa: PLC0415

    status = 0
    for path in args.files:
        try:
            with open(path, "rb") as handle:
                plan = parse_plan_json(handle.read())
        except OSError as exc:
            print(f"{path}: cannot read: {exc.strerror}", file=sys.stderr)
            status = 1
            continue
        except PlanError as exc:
            for problem in exc.problems:
                print(f"{path}: {problem}", file=sys.stderr)
            status = 1
            continue
        members = sum(len(pool.members) for pool in plan.pools)
        print(
            f"{path}: ok, plan v{plan.version}: {len(plan.zones)} zones, "
            f"{len(plan.pools)} pools, {members} members"
        )
    return status


def _pipe_backend(args: argparse.Namespace) -> int:
    import os  # noqa: PLC0415
    import random  # noqa: PLC0415

    from dnslb.errors import ConfigError  # noqa: PLC0415
    from dnslb.plan_store import (  # noqa: PLC0415
        FilePlanStore,
        last_good_store,
        open_store,
        read_regular_file,
    )
    from pipe_backend.backend import PipeBackend  # noqa: PLC0415

    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format=f"dnslb pipe-backend[{os.getpid()}]: %(levelname)s %(message)s",
    )
    rng = random.Random(args.seed) if args.seed is not None else random.Random()
    password = None
    if args.redis_password_file:
        try:  # a regular file of at most 4 KiB: a FIFO there must not block the coprocess
            raw = read_regular_file(args.redis_password_file, 4096)
            password = raw.decode("utf-8").strip()
        except OSError as exc:
            raise ConfigError(
                "pipe backend", [f"{args.redis_password_file}: {exc.strerror}"]
            ) from None
        except UnicodeDecodeError:
            raise ConfigError(
                "pipe backend", [f"{args.redis_password_file}: not UTF-8 text"]
            ) from None
    store = open_store(args.plan, password=password)
    last_good = FilePlanStore(args.last_good) if args.last_good else last_good_store(store)
    backend = PipeBackend(
        store,
        last_good=last_good,
        rng=rng,
        poll_interval=args.poll_interval,
    )
    backend.poll(force=True)
    with contextlib.suppress(BrokenPipeError):  # PowerDNS went away mid-reply
        backend.serve(sys.stdin.fileno(), sys.stdout.fileno())
    return 0


def _pdns_config(args: argparse.Namespace) -> int:
    from pathlib import Path  # noqa: PLC0415

    from dnslb.pdns import PdnsSettings, render_config  # noqa: PLC0415

    plan = args.plan if "://" in args.plan else str(Path(args.plan).resolve())
    password_file = args.redis_password_file
    settings = PdnsSettings(
        plan=plan,
        address=args.address,
        port=args.port,
        threads=args.threads,
        redis_password_file=str(Path(password_file).resolve()) if password_file else None,
    )
    sys.stdout.write(render_config(settings, args.socket_dir))
    return 0


def _agent(args: argparse.Namespace) -> int:
    from agents.agent import main as agent_main  # noqa: PLC0415

    return agent_main(args.config)


def _cache_server(args: argparse.Namespace) -> int:
    from agents.cache_server import main as cache_server_main  # noqa: PLC0415
    from dnslb.nginx import NginxSettings  # noqa: PLC0415

    settings = NginxSettings(
        address=args.address,
        port=args.port,
        origin=args.origin,
        capacity_rps=args.capacity_rps,
        send_rate=args.send_rate,
        send_chunk=args.send_chunk,
    )
    return cache_server_main(settings, args.workdir, args.agent_config)


def _manager(args: argparse.Namespace) -> int:
    import asyncio  # noqa: PLC0415
    import signal  # noqa: PLC0415

    from manager.config import load_manager_config  # noqa: PLC0415
    from manager.service import Manager  # noqa: PLC0415

    logging.basicConfig(
        stream=sys.stderr,
        level=getattr(logging, args.log_level.upper()),
        format="%(asctime)s dnslb manager: %(levelname)s %(message)s",
    )
    # httpx logs every request at INFO (the docker provider polls a booting container twice a
    # second): its lines would drown the manager's own.
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    loaded = load_manager_config(args.config)
    if args.check:
        print(f"{args.config}: ok")
        return 0

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        manager = Manager(loaded)
        attach_api(manager)
        await manager.run(stop)

    asyncio.run(main())
    return 0


def attach_api(manager: Manager) -> None:
    """Serve the REST API, ``/metrics`` and the dashboard from ``manager``'s HTTP listener.

    Here, because this is the one place that knows both components: the API sees the manager
    only through :class:`dnslb.control.ManagerControl`.
    """
    from api.app import create_app  # noqa: PLC0415
    from api.auth import ApiAuth  # noqa: PLC0415
    from dnslb.config import json_schema  # noqa: PLC0415
    from manager.config import MemberConfig, PoolConfig  # noqa: PLC0415
    from manager.control import Control  # noqa: PLC0415

    config = manager.config
    if not config.auth.api_tokens:
        log.warning("no auth.api_tokens configured: the REST API and dashboard refuse every call")
    auth = ApiAuth.from_tokens(
        ((entry.token.reveal(), entry.role) for entry in config.auth.api_tokens),
        metrics_public=config.auth.metrics_public,
    )
    manager.api = create_app(
        Control(manager),
        auth=auth,
        pool_schema=json_schema(PoolConfig),
        member_schema=json_schema(MemberConfig),
        cors_origins=config.http.cors_origins,
    )


def _ctl(args: argparse.Namespace) -> int:
    from api.ctl import run  # noqa: PLC0415

    return run(args)


def _docs(args: argparse.Namespace) -> int:
    from dnslb.docgen import stale_docs, write_docs  # noqa: PLC0415

    if args.check:
        stale = stale_docs()
        for path in stale:
            print(f"{path}: configuration reference out of date (run: dnslb docs)", file=sys.stderr)
        return 1 if stale else 0
    for path in write_docs():
        print(f"updated {path}")
    return 0


def _lab(args: argparse.Namespace) -> int:
    from dnslb.lab.runner import run_lab  # noqa: PLC0415

    return run_lab(args)


def _loadtest(args: argparse.Namespace) -> int:
    from loadtest.run import main as loadtest_main  # noqa: PLC0415

    return loadtest_main(args)


def _report(args: argparse.Namespace) -> int:
    from dnslb.lab.report import main as report_main  # noqa: PLC0415

    return report_main(args)


def _experiments(args: argparse.Namespace) -> int:
    from loadtest.experiments import main as experiments_main  # noqa: PLC0415

    return experiments_main(args)


def _origin(args: argparse.Namespace) -> int:
    import os  # noqa: PLC0415

    from dnslb.config import parse_config  # noqa: PLC0415
    from dnslb.lab.objects import ObjectCatalog  # noqa: PLC0415
    from dnslb.lab.origin import serve  # noqa: PLC0415

    catalog = parse_config(
        f"{{count: {args.objects}, mean_size: {args.mean_size}, min_size: {args.min_size}}}",
        ObjectCatalog,
        source="dnslb origin options",
    )
    if args.pid_file:
        with open(args.pid_file, "w") as handle:
            handle.write(f"{os.getpid()}\n")
    logging.basicConfig(stream=sys.stderr, level=logging.INFO)
    return serve(args.address, args.port, catalog, args.max_age)


def _node_agent(args: argparse.Namespace) -> int:
    import os  # noqa: PLC0415

    from agents.node_agent import (  # noqa: PLC0415
        MIN_TOKEN_LENGTH,
        NodeAgentConfig,
        read_token,
        run,
    )
    from dnslb.errors import ConfigError  # noqa: PLC0415

    # Collect every problem (listen address, token, settings) before failing.
    problems: list[str] = []
    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit():
        problems.append(f"--listen {args.listen!r}: expected HOST:PORT")
        host, port = "127.0.0.1", "0"
    try:
        token = read_token(args.token_file, args.token_env)
    except ConfigError as exc:
        problems += exc.problems
        token = "-" * MIN_TOKEN_LENGTH  # stands in so that the other settings get checked
    try:
        config = NodeAgentConfig(
            cluster=args.cluster,
            node_id=args.node_id,
            vip=args.vip,
            token=token,
            manager_url=args.manager_url,
            listen_host=host.strip("[]"),
            listen_port=int(port),
            driver=args.driver,
            bucket_count=args.bucket_count,
            heartbeat_interval=args.heartbeat_interval,
            max_concurrency=args.max_concurrency,
            service_ports=tuple(args.service_port),
            nft_table=args.nft_table,
            require_listener=not args.no_listener_check,
            lease=args.lease,
        )
    except ConfigError as exc:
        problems += exc.problems
    if problems:
        raise ConfigError("node agent", problems)
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format=f"dnslb node-agent[{os.getpid()}]: %(levelname)s %(message)s",
    )
    return run(config)


def _sim(args: argparse.Namespace) -> int:
    from sim.runner import main  # noqa: PLC0415

    return main(args)


def add_lab_arguments(parser: argparse.ArgumentParser) -> None:
    """``dnslb lab``'s options (here, so that building the parser imports nothing more)."""
    parser.add_argument(
        "--workdir",
        help="the lab's directory, every file of a run (default ~/.local/state/dnslb/lab)",
    )
    parser.add_argument("--dns-port", type=int, default=5300, help="DNS port on 127.0.0.1 (5300)")
    parser.add_argument(
        "--api-port", type=int, default=8700, help="manager: API, dashboard, metrics (8700)"
    )
    parser.add_argument(
        "--http-port", type=int, default=8080, help="port of every cache server (8080)"
    )
    parser.add_argument(
        "--origin-port", type=int, default=8000, help="origin port on 127.0.0.1 (8000)"
    )
    parser.add_argument(
        "--network", default="127.0.1", help="cache servers' addresses NETWORK.1, .2... (127.0.1)"
    )
    parser.add_argument(
        "--boot-delay", type=float, default=10.0, help="seconds a cache server takes to boot (10)"
    )
    parser.add_argument("--min-servers", type=int, default=1, help="autoscaling floor (1)")
    parser.add_argument("--max-servers", type=int, default=4, help="autoscaling ceiling (4)")
    parser.add_argument("--k", type=int, help="addresses per answer (policy default: 4)")
    parser.add_argument("--ttl-max", type=int, help="TTL at low load (policy default: 60)")
    parser.add_argument("--ttl-min", type=int, help="TTL near th_over (policy default: 5)")
    parser.add_argument(
        "--th-over", type=float, help="pause a server above this utilization (default: 0.8)"
    )
    parser.add_argument(
        "--keep-state",
        action="store_true",
        help="keep the state database and samples of the last run (default: start clean)",
    )
    parser.add_argument(
        "--once", action="store_true", help="start, show a few answers, stop (a smoke test)"
    )


def add_loadtest_arguments(parser: argparse.ArgumentParser) -> None:
    """``dnslb loadtest``'s options."""
    parser.add_argument("--lab", help="the lab's directory (default: the lab's default)")
    parser.add_argument("--out", help="output directory (default LAB/loadtest/TIMESTAMP)")
    parser.add_argument("--start-users", type=int, default=20, help="users at the start (20)")
    parser.add_argument("--step-users", type=int, default=20, help="users added each step (20)")
    parser.add_argument("--step-time", type=float, default=30.0, help="seconds a step (30)")
    parser.add_argument("--steps", type=int, default=5, help="steps after the start (5)")
    parser.add_argument("--hold", type=float, default=30.0, help="seconds at the peak (30)")
    parser.add_argument("--think-time", type=float, default=1.0, help="mean think time (1 s)")
    parser.add_argument(
        "--ignore-ttl", type=float, default=0.1, help="fraction of users ignoring TTLs (0.1)"
    )
    parser.add_argument(
        "--ignore-ttl-hold",
        type=float,
        default=600.0,
        help="seconds such a user keeps an answer (600)",
    )
    parser.add_argument(
        "--connect", choices=["first", "random"], default="first", help="address used (first)"
    )
    parser.add_argument(
        "--request-timeout", type=float, default=60.0, help="a user gives up after (60 s)"
    )
    parser.add_argument("--seed", type=int, help="seed of the users' random choices")


FUZZ_HARNESSES = {
    "plan": "dnslb.fuzz_plan:PlanHarness",
    "pipe-protocol": "pipe_backend.fuzz_protocol:ProtocolHarness",
    "reports": "manager.fuzz_reports:ReportHarness",
    "resp": "dnslb.fuzz_resp:RespHarness",
    "heartbeats": "manager.fuzz_heartbeats:HeartbeatHarness",
    "tables": "agents.fuzz_tables:TableHarness",
    "http": "manager.fuzz_http:HttpHarness",
}
"""Every fuzz harness by name, as ``module:class`` (each lives beside the code it guards)."""


def fuzz_harness(name: str) -> Harness:
    """A new instance of the harness called ``name``."""
    import importlib  # noqa: PLC0415

    module, _, attribute = FUZZ_HARNESSES[name].partition(":")
    harness: Harness = getattr(importlib.import_module(module), attribute)()
    return harness


def _fuzz(args: argparse.Namespace) -> int:
    import random  # noqa: PLC0415
    import signal  # noqa: PLC0415
    import threading  # noqa: PLC0415

    from dnslb.fuzzing import Failure, RunResult, run  # noqa: PLC0415

    if args.list:
        for name in FUZZ_HARNESSES:
            harness = fuzz_harness(name)
            print(f"{name:15} {harness.boundary}")
        return 0
    unknown = [name for name in args.harnesses if name not in FUZZ_HARNESSES]
    if unknown:
        print(f"dnslb fuzz: unknown harness {', '.join(unknown)}; see --list", file=sys.stderr)
        return 2
    names = args.harnesses or list(FUZZ_HARNESSES)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    seconds = args.seconds
    if args.inputs is None and seconds is None:
        seconds = 60.0
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())  # Ctrl-C: the summary so far
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    status = 0
    for name in names:
        shown: list[Failure] = []

        def show(result: RunResult, name: str = name, shown: list[Failure] = shown) -> None:
            for failure in result.failures[len(shown) : 5]:
                shown.append(failure)
                print(
                    f"  {failure.kind} at input {failure.index} (again: dnslb fuzz {name} "
                    f"--seed {seed} --start {failure.index} --inputs 1):\n"
                    + "\n".join(f"    {line}" for line in failure.detail.splitlines()[-12:]),
                    flush=True,
                )

        def progress(result: RunResult, show: Callable[[RunResult], None] = show) -> None:
            print(result.summary(), file=sys.stderr, flush=True)
            show(result)

        result = run(
            fuzz_harness(name),
            seed=seed,
            inputs=args.inputs,
            seconds=seconds,
            start=args.start,
            progress=progress,
            stop=stop,
        )
        print(result.summary(), flush=True)
        show(result)
        if not result.ok:
            status = 1
        if stop.is_set():
            break
    return status


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dnslb", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"dnslb {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    plan = commands.add_parser("plan", help="work with plan files")
    plan_commands = plan.add_subparsers(dest="plan_command", required=True, metavar="ACTION")
    check = plan_commands.add_parser("check", help="validate plan files, listing every problem")
    check.add_argument("files", nargs="+", metavar="FILE")
    check.set_defaults(handler=_plan_check)

    pipe = commands.add_parser(
        "pipe-backend", help="the PowerDNS pipe coprocess (use as pdns pipe-command)"
    )
    pipe.add_argument(
        "--plan",
        required=True,
        help="plan location: a JSON file path, or redis://HOST:PORT/DB?key=NAME",
    )
    pipe.add_argument(
        "--last-good",
        default=None,
        help="where to keep a copy of the last plan loaded (default: beside a plan file)",
    )
    pipe.add_argument(
        "--redis-password-file",
        default=None,
        help="file holding the Redis password (else DNSLB_REDIS_PASSWORD)",
    )
    pipe.add_argument(
        "--poll-interval",
        type=float,
        default=0.25,
        help="seconds between checks for a new plan (default 0.25)",
    )
    pipe.add_argument("--seed", type=int, help="seed the rotation (tests only)")
    pipe.set_defaults(handler=_pipe_backend)

    pdns = commands.add_parser("pdns-config", help="print a pdns.conf for the pipe backend")
    pdns.add_argument(
        "--plan", required=True, help="plan the pipe backend serves (file path or redis:// URL)"
    )
    pdns.add_argument("--address", default="127.0.0.1", help="address pdns listens on")
    pdns.add_argument("--port", type=int, default=53, help="port pdns listens on (default 53)")
    pdns.add_argument("--threads", type=int, default=2, help="distributor threads (default 2)")
    pdns.add_argument("--socket-dir", default="/run/pdns", help="pdns control socket directory")
    pdns.add_argument(
        "--redis-password-file",
        default=None,
        metavar="FILE",
        help="file holding the password of a redis:// plan, given to the pipe backend by path "
        "(a password in the URL is refused: pdns's pipe-command is visible in ps)",
    )
    pdns.set_defaults(handler=_pdns_config)

    agent = commands.add_parser(
        "agent", help="the agent of a cache server: reports its utilization to the manager"
    )
    agent.add_argument("--config", required=True, metavar="FILE", help="agent configuration")
    agent.set_defaults(handler=_agent)

    cache = commands.add_parser(
        "cache-server",
        help="a cache server in one process tree: nginx and its agent (a container's command)",
    )
    cache.add_argument("--agent-config", required=True, metavar="FILE", help="agent config")
    cache.add_argument("--origin", required=True, help="the origin nginx caches, http://HOST:PORT")
    cache.add_argument("--address", default="0.0.0.0", help="listen address (0.0.0.0)")  # noqa: S104
    cache.add_argument("--port", type=int, default=8080, help="listen port (8080)")
    cache.add_argument(
        "--workdir", default="/var/lib/dnslb/cache", help="nginx's files and cache directory"
    )
    cache.add_argument(
        "--capacity-rps", type=float, help="emulated capacity: requests a second (none: no limit)"
    )
    cache.add_argument(
        "--send-rate", type=int, help="emulated bandwidth: bytes a second per response"
    )
    cache.add_argument("--send-chunk", type=int, default=2048, help="bytes per paced write")
    cache.set_defaults(handler=_cache_server)

    manager = commands.add_parser("manager", help="run the manager (reports in, plan out)")
    manager.add_argument("--config", required=True, help="manager configuration (YAML)")
    manager.add_argument("--check", action="store_true", help="validate the config and exit")
    manager.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    manager.set_defaults(handler=_manager)

    _add_ctl(commands)

    docs = commands.add_parser("docs", help="regenerate the configuration references in docs/")
    docs.add_argument("--check", action="store_true", help="only check that they are current")
    docs.set_defaults(handler=_docs)

    lab = commands.add_parser(
        "lab",
        help="run the local lab: origin, manager with local cache servers, PowerDNS",
        description="Run the local lab until Ctrl-C: an origin, the manager (REST API, "
        "dashboard, metrics) launching nginx cache servers with agents on 127.0.1.x, PowerDNS "
        "with the pipe backend. Everything on loopback; docs/lab.md.",
    )
    add_lab_arguments(lab)
    lab.set_defaults(handler=_lab)

    loadtest = commands.add_parser(
        "loadtest",
        help="a headless locust step-load run against a lab, with CSV output",
        description="Run locust headless against a running lab (its lab.json says where): "
        "users resolve the load-balanced name through the lab's DNS with their own TTL-"
        "honouring caches, on a step load. Writes locust's CSVs and requests.csv.",
    )
    add_loadtest_arguments(loadtest)
    loadtest.set_defaults(handler=_loadtest)

    report = commands.add_parser(
        "report",
        help="the paper's columns, plots and scale events of a lab run (HTML, PNG, CSV)",
    )
    report.add_argument("--lab", help="the lab's directory (default: the lab's default)")
    report.add_argument("--loadtest", help="the load test's output (default: the newest)")
    report.add_argument("--out", help="where to write it (default LOADTEST/report)")
    report.add_argument("--name", default="lab run", help="the case's name in tables")
    report.set_defaults(handler=_report)

    experiments = commands.add_parser(
        "experiments",
        help="replay the paper's cases (tables 1-4) on the lab; one table of its columns",
    )
    experiments.add_argument(
        "--out", help="results directory (default ~/.local/state/dnslb/experiments/TIME)"
    )
    experiments.add_argument(
        "--case-duration", type=float, default=240.0, help="seconds of load per case (240)"
    )
    experiments.add_argument("--peak-users", type=int, default=105, help="users at the peak")
    experiments.add_argument("--max-servers", type=int, default=4, help="autoscaling ceiling")
    experiments.add_argument("--boot-delay", type=float, default=10.0, help="seconds (10)")
    experiments.add_argument("--tables", help="only these tables, e.g. 1,3 (default all)")
    experiments.add_argument("--cases", help="only cases whose key matches this regex (t3-c)")
    experiments.add_argument(
        "--show", metavar="DIR", help="print the table of an earlier run's results and exit"
    )
    experiments.add_argument("--dns-port", type=int, default=5300, help="DNS port (5300)")
    experiments.add_argument("--api-port", type=int, default=8700, help="manager port (8700)")
    experiments.add_argument("--http-port", type=int, default=8080, help="cache port (8080)")
    experiments.add_argument("--origin-port", type=int, default=8000, help="origin (8000)")
    experiments.set_defaults(handler=_experiments)

    origin = commands.add_parser("origin", help="the lab's origin web server (GET /objects/N)")
    origin.add_argument("--address", default="127.0.0.1", help="listen address (127.0.0.1)")
    origin.add_argument("--port", type=int, default=8000, help="listen port (8000)")
    origin.add_argument("--objects", type=int, default=100, help="number of objects (100)")
    origin.add_argument("--mean-size", type=int, default=10240, help="mean size, bytes (10240)")
    origin.add_argument("--min-size", type=int, default=2048, help="smallest size, bytes (2048)")
    origin.add_argument("--max-age", type=int, default=600, help="Cache-Control max-age (600)")
    origin.add_argument("--pid-file", help="write the process id here")
    origin.set_defaults(handler=_origin)

    node = commands.add_parser(
        "node-agent", help="the agent of a single-IP cluster node (installs dispatch tables)"
    )
    node.add_argument("--cluster", required=True, help="cluster name, as the manager knows it")
    node.add_argument("--node-id", required=True, help="this node's id in dispatch tables")
    node.add_argument("--vip", required=True, help="the cluster's shared IPv4 address")
    node.add_argument(
        "--listen",
        default="127.0.0.1:8470",
        help="HOST:PORT for table pushes (default %(default)s)",
    )
    node.add_argument("--manager-url", help="manager base URL for heartbeats (none: no heartbeats)")
    token = node.add_mutually_exclusive_group(required=True)
    token.add_argument("--token-file", help="file holding the bearer token")
    token.add_argument("--token-env", help="environment variable holding the bearer token")
    node.add_argument(
        "--driver",
        default="nftables",
        help="dispatch driver: nftables or dry-run (default %(default)s)",
    )
    node.add_argument(
        "--bucket-count", type=int, default=1024, help="buckets per table (default %(default)s)"
    )
    node.add_argument(
        "--heartbeat-interval",
        type=float,
        default=0.1,
        help="seconds between heartbeats (default %(default)s)",
    )
    node.add_argument(
        "--max-concurrency",
        type=int,
        default=1000,
        help="connections to the VIP at full load (default %(default)s)",
    )
    node.add_argument(
        "--service-port",
        type=int,
        action="append",
        default=[],
        help="port the service listens on (repeatable); none listening means not serving",
    )
    node.add_argument("--nft-table", default="dnslb", help="nftables table to own (default dnslb)")
    node.add_argument(
        "--no-listener-check",
        action="store_true",
        help="accept a SYN of our bucket even when no socket listens (the stack then resets it)",
    )
    node.add_argument(
        "--lease",
        type=float,
        default=0.25,
        help="seconds the node takes new connections without its agent, renewed before each "
        "heartbeat (0: forever; at least twice --heartbeat-interval, below the manager's "
        "failover_after) (default %(default)s)",
    )
    node.set_defaults(handler=_node_agent)

    fuzz = commands.add_parser(
        "fuzz",
        help="throw hostile inputs at the trust boundaries (plans, reports, protocol lines...)",
        description="Run fuzz harnesses: each builds hostile inputs from a seed, feeds them to "
        "the real code and checks the outcome. Without --seed a random one is drawn (printed); "
        "without --inputs each harness runs --seconds (default 60). Exit status 1 when any "
        "input crashed, hung or gave a malformed result.",
    )
    fuzz.add_argument("harnesses", nargs="*", metavar="NAME", help="harnesses (default: all)")
    fuzz.add_argument("--list", action="store_true", help="list the harnesses and exit")
    fuzz.add_argument("--seed", type=int, help="run seed (default: random, printed)")
    fuzz.add_argument("--inputs", type=int, help="inputs per harness")
    fuzz.add_argument("--seconds", type=float, help="seconds per harness")
    fuzz.add_argument("--start", type=int, default=0, help="index of the first input (replay)")
    fuzz.set_defaults(handler=_fuzz)

    sim = commands.add_parser(
        "sim", help="simulate scenarios with the product's policy (e.g. --suite paper)"
    )
    sim.add_argument(
        "scenarios", nargs="*", metavar="SCENARIO", help="scenario files (or shipped names)"
    )
    sim.add_argument("--suite", help="run a named set of shipped scenarios: paper, goals...")
    sim.add_argument("--seed", type=int, help="seed every run with this (default: its own)")
    sim.add_argument(
        "--repeat", type=int, default=1, help="runs per case with successive seeds, averaged"
    )
    sim.add_argument("--out", help="directory for results and plots")
    sim.add_argument("--no-plots", action="store_true", help="write results without plots")
    sim.add_argument("--jobs", type=int, default=0, help="worker processes (default: CPUs)")
    sim.set_defaults(handler=_sim)
    return parser


def _add_ctl(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ctl = commands.add_parser(
        "ctl",
        help="operate a running manager over its REST API",
        description="Operate a running manager over its REST API. Exit status: 0 done, 1 "
        "refused (404, 409, 422), 2 usage, 3 token refused (401, 403), 4 unreachable.",
    )
    ctl.add_argument("--url", help="manager URL (default $DNSLB_URL or http://127.0.0.1:8700)")
    source = ctl.add_mutually_exclusive_group()
    source.add_argument(
        "--token-env",
        metavar="NAME",
        help="environment variable holding the API token (default DNSLB_API_TOKEN)",
    )
    source.add_argument("--token-file", metavar="PATH", help="file holding the API token")
    ctl.add_argument("--json", action="store_true", help="print the API's JSON")
    ctl.add_argument("--timeout", type=float, default=10.0, help="seconds (default 10)")
    actions = ctl.add_subparsers(dest="ctl_command", required=True, metavar="COMMAND")
    actions.add_parser("status", help="readiness, plan, servers by state, pools")
    actions.add_parser("pools", help="pools with servers, cost, scale events")
    servers = actions.add_parser("servers", help="servers with state, load, weight, TTL")
    servers.add_argument("pool", nargs="?", help="only this pool's servers")
    for action, what in (
        ("pause", "leave a server out of answers (still measured) until resume"),
        ("resume", "clear an operator's pause"),
        ("disable", "take a server out whatever its health, until enable"),
        ("enable", "bring a disabled or drained server back (after a healthy report)"),
        ("drain", "take a server out of answers; a launched one is then terminated"),
    ):
        command = actions.add_parser(action, help=what)
        command.add_argument("server", metavar="ID", help="server id")
        command.add_argument("--reason", default="", help="kept in the event log")
    events = actions.add_parser("events", help="events, newest first")
    events.add_argument("--pool", help="only this pool's")
    events.add_argument("--server", help="only this server's")
    events.add_argument("--kind", action="append", help="only this kind (repeatable)")
    events.add_argument("--limit", type=int, default=20, help="how many (default 20)")
    events.add_argument("--before-id", type=int, help="older than this event id (paging)")
    ctl.set_defaults(handler=_ctl)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``dnslb`` command; returns the exit status."""
    args = build_parser().parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except DnslbError as exc:
        print(f"dnslb {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
