"""The ``dnslb`` command: one entry point, a subcommand per process or task.

This is the composition root: the one module that imports every component. Each component owns
the options of its subcommands (``pipe_backend.command``, ``agents.command``,
``manager.command``, ``lab.command``, ``sim.command``, ``daemons.command``, ``cli.ctl``), with
defaults taken from its settings; what runs a subcommand is imported only when it runs. An
expected error (:class:`~dnslb.errors.DnslbError`) becomes one clear message on stderr and exit
status 1; usage errors exit 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import agents.command as agents_command
import cli.calibrate as calibrate_command
import cli.ctl as ctl_command
import daemons.command as daemons_command
import lab.command as lab_command
import manager.command as manager_command
import pipe_backend.command as pipe_backend_command
import sim.command as sim_command
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


def _manager(args: argparse.Namespace) -> int:
    return manager_command.run(args, attach=attach_api)


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


def _docs(args: argparse.Namespace) -> int:
    from cli.docgen import stale_docs, write_docs  # noqa: PLC0415

    if args.check:
        stale = stale_docs()
        for path in stale:
            print(f"{path}: configuration reference out of date (run: dnslb docs)", file=sys.stderr)
        return 1 if stale else 0
    for path in write_docs():
        print(f"updated {path}")
    return 0


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
        "pipe-backend", help="the PowerDNS pipe coprocess (pdns runs it as python -m pipe_backend)"
    )
    pipe_backend_command.add_arguments(pipe)
    pipe.set_defaults(handler=pipe_backend_command.run)

    pdns = commands.add_parser("pdns-config", help="print a pdns.conf for the pipe backend")
    daemons_command.add_pdns_config_arguments(pdns)
    pdns.set_defaults(handler=daemons_command.run_pdns_config)

    dnssec = commands.add_parser(
        "pdns-dnssec-setup", help="sign zones served by pdns: keys, narrow NSEC3, the DS to publish"
    )
    daemons_command.add_pdns_dnssec_setup_arguments(dnssec)
    dnssec.set_defaults(handler=daemons_command.run_pdns_dnssec_setup)

    agent = commands.add_parser(
        "agent", help="the agent of a cache server: reports its utilization to the manager"
    )
    agents_command.add_agent_arguments(agent)
    agent.set_defaults(handler=agents_command.run_agent)

    cache = commands.add_parser(
        "cache-server",
        help="a cache server in one process tree: nginx and its agent (a container's command)",
    )
    agents_command.add_cache_server_arguments(cache)
    cache.set_defaults(handler=agents_command.run_cache_server)

    manager = commands.add_parser("manager", help="run the manager (reports in, plan out)")
    manager_command.add_arguments(manager)
    manager.set_defaults(handler=_manager)

    ctl = commands.add_parser(
        "ctl",
        help="operate a running manager over its REST API",
        description="Operate a running manager over its REST API. Exit status: 0 done, 1 "
        "refused (404, 409, 422), 2 usage, 3 token refused (401, 403), 4 unreachable.",
    )
    ctl_command.add_arguments(ctl)
    ctl.set_defaults(handler=ctl_command.run)

    docs = commands.add_parser("docs", help="regenerate the configuration references in docs/")
    docs.add_argument("--check", action="store_true", help="only check that they are current")
    docs.set_defaults(handler=_docs)

    lab_command.add_commands(commands)

    node = commands.add_parser(
        "node-agent", help="the agent of a single-IP cluster node (installs dispatch tables)"
    )
    agents_command.add_node_agent_arguments(node)
    node.set_defaults(handler=agents_command.run_node_agent)

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
    sim_command.add_arguments(sim)
    sim.set_defaults(handler=sim_command.run)

    calibrate = commands.add_parser(
        "calibrate",
        help="the simulator against the lab on the same experiment, side by side",
        description="Run cases of dnslb experiments on the lab and in the simulator (the "
        "simulator's scenario is derived from the lab's settings), then print each column of "
        "both with 95 % intervals and the relative difference (docs/simulation.md).",
    )
    calibrate_command.add_arguments(calibrate)
    calibrate.set_defaults(handler=calibrate_command.run)
    return parser


PACKAGES = frozenset(
    {
        "dnslb",
        "pipe_backend",
        "daemons",
        "agents",
        "manager",
        "api",
        "lab",
        "evaluation",
        "sim",
        "cli",
    }
)
"""The project's own packages (a missing one is a broken install, not a missing extra)."""

EXTRAS = {
    "agent": "agent",
    "cache-server": "agent",
    "node-agent": "agent",
    "manager": "manager",
    "ctl": "manager",
    "docs": "dev",
    "fuzz": "dev",
    "sim": "sim",
    "lab": "lab",
    "loadtest": "lab",
    "report": "lab",
    "experiments": "lab",
    "origin": "lab",
    "calibrate": "sim,lab",
}
"""The package extra each subcommand needs (the core's commands need none): docs/install.md."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``dnslb`` command; returns the exit status."""
    args = build_parser().parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except DnslbError as exc:
        print(f"dnslb {args.command}: {exc}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as exc:
        extra = EXTRAS.get(args.command)
        if extra is None or (exc.name or "").split(".")[0] in PACKAGES:
            raise
        print(
            f"dnslb {args.command}: {exc.name} is not installed; this command needs the "
            f"{extra} extra: pip install 'dnslb[{extra}]'",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt:
        return 130
