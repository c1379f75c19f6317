"""The lab's command lines: ``dnslb lab``, ``loadtest``, ``report``, ``experiments`` and
``origin``. The lab is one component: its runner, origin, load tests (locust), experiments and
report all live in :mod:`lab`.

Each command turns its options into the settings its library function takes
(:class:`~lab.settings.LabSettings`, :class:`~lab.loadtest.run.LoadTest`,
:class:`~lab.experiments.ExperimentPlan`, :class:`~lab.origin.OriginSettings`) and calls it: no
parsed options travel further. Every option's default is the default of the field it fills
(:func:`dnslb.config.default_of`), declared once, there. Settings are checked here, as
:func:`dnslb.config.checked` checks them, and a problem names the option rather than the field
(``--dns-port: must be at most 65535, not 70000``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import re
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from dnslb import logs
from dnslb.config import checked, default_of
from dnslb.errors import ConfigError
from lab.experiments import PRESETS, ExperimentPlan
from lab.loadtest.run import LoadTest
from lab.loadtest.shape import StepLoad
from lab.objects import ObjectCatalog
from lab.origin import OriginSettings
from lab.report import RUN_NAME
from lab.runner import LabInfo
from lab.settings import LabSettings, default_workdir

_T = TypeVar("_T")

LAB_OPTIONS = {
    "workdir": "--workdir",
    "dns_port": "--dns-port",
    "api_port": "--api-port",
    "http_port": "--http-port",
    "origin_port": "--origin-port",
    "network": "--network",
    "resolvers": "--resolvers",
    "resolver_network": "--resolver-network",
    "boot_delay": "--boot-delay",
    "scaling.boot_time": "--boot-delay",
    "scaling.min_servers": "--min-servers",
    "scaling.max_servers": "--max-servers",
    "policy.k": "--k",
    "policy.ttl_max": "--ttl-max",
    "policy.ttl_min": "--ttl-min",
    "policy.th_over": "--th-over",
}
"""The fields of :class:`LabSettings` that ``dnslb lab``'s options fill, and the options."""

LOAD_OPTIONS = {
    "start": "--start-users",
    "step": "--step-users",
    "every": "--step-time",
    "count": "--steps",
    "hold": "--hold",
}
"""The fields of :class:`StepLoad` that ``dnslb loadtest``'s options fill."""

LOADTEST_OPTIONS = {
    "out": "--out",
    "think_time": "--think-time",
    "ignore_ttl": "--ignore-ttl",
    "ignore_ttl_hold": "--ignore-ttl-hold",
    "connect": "--connect",
    "request_timeout": "--request-timeout",
    "seed": "--seed",
}
"""The fields of :class:`LoadTest` that ``dnslb loadtest``'s options fill."""

EXPERIMENT_OPTIONS = {
    "tables": "--tables",
    "cases": "--cases",
    "case_duration": "--case-duration",
    "peak_users": "--peak-users",
    "constant_load": "--constant-load",
    "repeats": "--repeats",
    **{f"lab.{field}": option for field, option in LAB_OPTIONS.items()},
}
"""The fields of :class:`ExperimentPlan` (and the case selection) ``dnslb experiments`` fills."""

ORIGIN_OPTIONS = {
    "address": "--address",
    "port": "--port",
    "objects.count": "--objects",
    "objects.mean_size": "--mean-size",
    "objects.min_size": "--min-size",
    "max_age": "--max-age",
}
"""The fields of :class:`OriginSettings` that ``dnslb origin``'s options fill."""


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the lab's subcommands to ``commands``."""
    lab = commands.add_parser(
        "lab",
        help="run the local lab: origin, manager with local cache servers, PowerDNS",
        description="Run the local lab until Ctrl-C: an origin, the manager (REST API, "
        "dashboard, metrics) launching nginx cache servers with agents on 127.0.1.x, PowerDNS "
        "with the pipe backend. Everything on loopback; docs/lab.md.",
    )
    add_lab_arguments(lab)
    lab.set_defaults(handler=run_lab)

    loadtest = commands.add_parser(
        "loadtest",
        help="a headless locust step-load run against a lab, with CSV output",
        description="Run locust headless against a running lab (its lab.json says where): "
        "users resolve the load-balanced name through the lab's DNS with their own TTL-"
        "honouring caches, on a step load. Writes locust's CSVs and requests.csv.",
    )
    add_loadtest_arguments(loadtest)
    loadtest.set_defaults(handler=run_loadtest)

    report = commands.add_parser(
        "report",
        help="the paper's columns, plots and scale events of a lab run (HTML, PNG, CSV)",
    )
    add_report_arguments(report)
    report.set_defaults(handler=run_report)

    experiments = commands.add_parser(
        "experiments",
        help="replay the paper's cases (tables 1-4) on the lab; one table of its columns",
    )
    add_experiments_arguments(experiments)
    experiments.set_defaults(handler=run_experiments)

    origin = commands.add_parser("origin", help="the lab's origin web server (GET /objects/N)")
    add_origin_arguments(origin)
    origin.set_defaults(handler=run_origin)


# -- dnslb lab --------------------------------------------------------------------------------


def add_lab_arguments(parser: argparse.ArgumentParser) -> None:
    """``dnslb lab``'s options."""
    parser.add_argument(
        "--workdir",
        help="the lab's directory, every file of a run (default ~/.local/state/dnslb/lab)",
    )
    add_lab_ports(parser)
    policy = default_of(LabSettings, "policy")
    parser.add_argument(
        "--network",
        default=default_of(LabSettings, "network"),
        help="cache servers' addresses NETWORK.1, .2... (%(default)s)",
    )
    parser.add_argument("--k", type=int, help=f"addresses per answer (policy default: {policy.k})")
    parser.add_argument(
        "--ttl-max", type=int, help=f"TTL at low load (policy default: {policy.ttl_max})"
    )
    parser.add_argument(
        "--ttl-min", type=int, help=f"TTL near th_over (policy default: {policy.ttl_min})"
    )
    parser.add_argument(
        "--th-over",
        type=float,
        help=f"pause a server above this utilization (default: {policy.th_over})",
    )
    parser.add_argument(
        "--keep-state",
        action="store_true",
        help="keep the state database and samples of the last run (default: start clean)",
    )
    parser.add_argument(
        "--once", action="store_true", help="start, show a few answers, stop (a smoke test)"
    )


def add_lab_ports(parser: argparse.ArgumentParser) -> None:
    """The options ``dnslb lab``, ``dnslb experiments`` and ``dnslb calibrate`` share: the lab's
    ports, its cache servers' boot delay, the autoscaling floor and ceiling, the resolvers."""

    def default(name: str) -> Any:
        return default_of(LabSettings, name)

    parser.add_argument(
        "--dns-port",
        type=int,
        default=default("dns_port"),
        help="DNS port on 127.0.0.1 (%(default)s)",
    )
    parser.add_argument(
        "--api-port",
        type=int,
        default=default("api_port"),
        help="manager: API, dashboard, metrics (%(default)s)",
    )
    parser.add_argument(
        "--http-port",
        type=int,
        default=default("http_port"),
        help="port of every cache server (%(default)s)",
    )
    parser.add_argument(
        "--origin-port",
        type=int,
        default=default("origin_port"),
        help="origin port on 127.0.0.1 (%(default)s)",
    )
    parser.add_argument(
        "--boot-delay",
        type=float,
        default=default("boot_delay"),
        help="seconds a cache server takes to boot (%(default)s)",
    )
    parser.add_argument(
        "--min-servers",
        type=int,
        default=default("scaling").min_servers,
        help="autoscaling floor (%(default)s; with --max-servers the same: a fixed pool)",
    )
    parser.add_argument(
        "--max-servers",
        type=int,
        default=default("scaling").max_servers,
        help="autoscaling ceiling (%(default)s)",
    )
    parser.add_argument(
        "--resolvers",
        type=int,
        default=default("resolvers"),
        help="caching resolvers (unbound) between users and pdns; 0: none (%(default)s)",
    )
    parser.add_argument(
        "--resolver-network",
        default=default("resolver_network"),
        help="resolvers' addresses NETWORK.1, .2... at the DNS port (%(default)s)",
    )
    parser.add_argument(
        "--rrset-roundrobin",
        action=argparse.BooleanOptionalAction,
        default=default("rrset_roundrobin"),
        help="resolvers rotate a cached answer's order for each client (default: keep "
        "pdns's order)",
    )


def lab_settings(args: argparse.Namespace) -> LabSettings:
    """The lab's settings from ``dnslb lab``'s (or ``experiments``') options, checked: a
    problem names its option. Policy options not given keep the product's defaults."""
    workdir = getattr(args, "workdir", None)
    base = LabSettings(workdir=Path(workdir)) if workdir else LabSettings()
    given = {
        name: getattr(args, name)
        for name in ("k", "ttl_max", "ttl_min", "th_over")
        if getattr(args, name, None) is not None
    }
    scaling = dataclasses.replace(
        base.scaling,
        min_servers=args.min_servers,
        max_servers=args.max_servers,
        boot_time=args.boot_delay,
    )
    settings = dataclasses.replace(
        base,
        dns_port=args.dns_port,
        api_port=args.api_port,
        http_port=args.http_port,
        origin_port=args.origin_port,
        network=getattr(args, "network", base.network),
        boot_delay=args.boot_delay,
        resolvers=args.resolvers,
        resolver_network=args.resolver_network,
        rrset_roundrobin=args.rrset_roundrobin,
        policy=dataclasses.replace(base.policy, **given),
        scaling=scaling,
    )
    return _checked(settings, LAB_OPTIONS)


def run_lab(args: argparse.Namespace) -> int:
    """Run the local lab until Ctrl-C."""
    from lab.runner import run_lab as run  # noqa: PLC0415

    return run(lab_settings(args), keep_state=args.keep_state, once=args.once)


# -- dnslb loadtest ---------------------------------------------------------------------------


def add_loadtest_arguments(parser: argparse.ArgumentParser) -> None:
    """``dnslb loadtest``'s options."""

    def test(name: str) -> Any:
        return default_of(LoadTest, name)

    def load(name: str) -> Any:
        return default_of(StepLoad, name)

    parser.add_argument("--lab", help="the lab's directory (default: the lab's default)")
    parser.add_argument("--out", help="output directory (default LAB/loadtest/TIMESTAMP)")
    parser.add_argument(
        "--start-users", type=int, default=load("start"), help="users at the start (%(default)s)"
    )
    parser.add_argument(
        "--step-users",
        type=int,
        default=load("step"),
        help="users added each step (%(default)s)",
    )
    parser.add_argument(
        "--step-time", type=float, default=load("every"), help="seconds a step (%(default)s)"
    )
    parser.add_argument(
        "--steps", type=int, default=load("count"), help="steps after the start (%(default)s)"
    )
    parser.add_argument(
        "--hold", type=float, default=load("hold"), help="seconds at the peak (%(default)s)"
    )
    parser.add_argument(
        "--think-time",
        type=float,
        default=test("think_time"),
        help="mean think time (%(default)s s)",
    )
    parser.add_argument(
        "--ignore-ttl",
        type=float,
        default=test("ignore_ttl"),
        help="fraction of users ignoring TTLs (%(default)s)",
    )
    parser.add_argument(
        "--ignore-ttl-hold",
        type=float,
        default=test("ignore_ttl_hold"),
        help="seconds such a user keeps an answer (%(default)s)",
    )
    parser.add_argument(
        "--connect",
        choices=["first", "random"],
        default=test("connect"),
        help="address used (%(default)s)",
    )
    parser.add_argument(
        "--request-timeout",
        type=float,
        default=test("request_timeout"),
        help="a user gives up after (%(default)s s)",
    )
    parser.add_argument(
        "--user-cache",
        action=argparse.BooleanOptionalAction,
        default=test("user_cache"),
        help="each user keeps its answer for the TTL itself (default); --no-user-cache: it "
        "asks its resolver before every request",
    )
    parser.add_argument(
        "--direct",
        action="store_true",
        help="users ask pdns directly, not the lab's resolvers",
    )
    parser.add_argument("--seed", type=int, help="seed of the users' random choices")


def run_loadtest(args: argparse.Namespace) -> int:
    """A headless locust run against a running lab (its ``lab.json`` says where)."""
    from lab.loadtest.run import describe, run_loadtest, summary  # noqa: PLC0415
    from lab.runner import read_lab_info  # noqa: PLC0415

    info = read_lab_info(Path(args.lab) if args.lab else default_workdir())
    test = load_test(args, info)
    print(f"dnslb loadtest: {describe(test)}", flush=True)
    run_loadtest(test)
    print(summary(test.out))
    print(f"report:  dnslb report --lab {info.workdir} --loadtest {test.out}")
    return 0


def load_test(args: argparse.Namespace, info: LabInfo) -> LoadTest:
    """The load test ``dnslb loadtest``'s options ask for against the lab ``info`` describes,
    checked: a problem names its option."""
    load = StepLoad(
        start=args.start_users,
        step=args.step_users,
        every=args.step_time,
        count=args.steps,
        hold=args.hold,
    )
    load = _checked(load, LOAD_OPTIONS)
    out = (
        Path(args.out)
        if args.out
        else Path(info.workdir) / "loadtest" / time.strftime("%Y%m%d-%H%M%S")
    )
    test = LoadTest(
        out=out,
        dns_server=info.dns_servers(direct=args.direct),
        lb_name=info.dns_name,
        http_port=info.http_port,
        objects=info.catalog.count,
        load=load,
        think_time=args.think_time,
        user_cache=args.user_cache,
        ignore_ttl=args.ignore_ttl,
        ignore_ttl_hold=args.ignore_ttl_hold,
        connect=args.connect,
        request_timeout=args.request_timeout,
        seed=args.seed,
    )
    return _checked(test, LOADTEST_OPTIONS)


# -- dnslb report -----------------------------------------------------------------------------


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    """``dnslb report``'s options."""
    parser.add_argument("--lab", help="the lab's directory (default: the lab's default)")
    parser.add_argument("--loadtest", help="the load test's output (default: the newest)")
    parser.add_argument("--out", help="where to write it (default LOADTEST/report)")
    parser.add_argument("--name", default=RUN_NAME, help="the case's name in tables")


def run_report(args: argparse.Namespace) -> int:
    """The paper's columns and plots of a lab run."""
    from evaluation.columns import table  # noqa: PLC0415
    from lab.report import load_run, newest_loadtest, write_report  # noqa: PLC0415

    lab_dir = Path(args.lab) if args.lab else default_workdir()
    loadtest_dir = Path(args.loadtest) if args.loadtest else newest_loadtest(lab_dir)
    out = Path(args.out) if args.out else loadtest_dir / "report"
    result = write_report(load_run(lab_dir, loadtest_dir), out, name=args.name)
    print(table([result]))
    print(f"\nreport: {out / 'report.html'} (summary.csv, timeseries.csv, PNG plots beside it)")
    return 0


# -- dnslb experiments ------------------------------------------------------------------------


def add_experiments_arguments(parser: argparse.ArgumentParser) -> None:
    """``dnslb experiments``' options."""

    def default(name: str) -> Any:
        return default_of(ExperimentPlan, name)

    parser.add_argument(
        "--out", help="results directory (default ~/.local/state/dnslb/experiments/TIME)"
    )
    parser.add_argument(
        "--preset",
        choices=["quick", "full"],
        help="the headline cases: quick (2 repeats of 120 s, about 20 min) or full (5 repeats "
        "of 300 s, about 110 min); --cases, --tables, --repeats, --case-duration then ignored",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=default("repeats"),
        help="runs of each case, for means and 95 %% intervals (%(default)s)",
    )
    add_load_arguments(parser)
    parser.add_argument("--tables", help="only these tables, e.g. 1,3 (default all)")
    parser.add_argument("--cases", help="only cases whose key matches this regex (t3-c)")
    parser.add_argument(
        "--show", metavar="DIR", help="print the table of an earlier run's results and exit"
    )
    add_lab_ports(parser)
    parser.set_defaults(max_servers=default("lab").scaling.max_servers)


def add_load_arguments(parser: argparse.ArgumentParser) -> None:
    """The step load of an experiment's runs (``dnslb experiments``, ``dnslb calibrate``)."""

    def default(name: str) -> Any:
        return default_of(ExperimentPlan, name)

    parser.add_argument(
        "--case-duration",
        type=float,
        default=default("case_duration"),
        help="seconds of load per run (%(default)s)",
    )
    parser.add_argument(
        "--peak-users",
        type=int,
        default=default("peak_users"),
        help="users at the peak (%(default)s)",
    )
    parser.add_argument(
        "--constant-load",
        action="store_true",
        help="the peak's users for the whole run instead of the step load (pausing at a load "
        "held, on a fixed pool with --min-servers and --max-servers)",
    )
    parser.add_argument(
        "--together",
        action="store_true",
        help="start every resolver empty, so that they ask together (default: each starts "
        "with a real answer expiring at a random moment of its TTL, out of phase)",
    )


def run_experiments(args: argparse.Namespace) -> int:
    """The paper's cases replayed on the lab."""
    from lab.experiments import (  # noqa: PLC0415
        ordering_lines,
        read_results,
        results_table,
        run_experiments,
        select_cases,
        select_preset,
    )

    if args.show:
        results = read_results(Path(args.show))
        print(results_table(results))
        print("\n".join(["", "The paper's orderings (95 % intervals):", *ordering_lines(results)]))
        return 0
    if args.preset:
        cases = select_preset(args.preset)
    else:
        with _options_named(EXPERIMENT_OPTIONS):
            cases = select_cases(args.tables, args.cases)
    return run_experiments(experiment_plan(args), cases)


def experiment_plan(args: argparse.Namespace) -> ExperimentPlan:
    """The plan ``dnslb experiments``' options ask for, checked: a problem names its option."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(args.out) if args.out else default_workdir().parent / "experiments" / stamp
    preset = PRESETS[args.preset] if getattr(args, "preset", None) else {}
    plan = ExperimentPlan(
        out=out.resolve(),
        lab=lab_settings(args),
        case_duration=preset.get("case_duration", args.case_duration),
        peak_users=args.peak_users,
        constant_load=args.constant_load,
        repeats=preset.get("repeats", args.repeats),
        staggered=not args.together,
    )
    return _checked(plan, EXPERIMENT_OPTIONS)


# -- dnslb origin -----------------------------------------------------------------------------


def add_origin_arguments(parser: argparse.ArgumentParser) -> None:
    """``dnslb origin``'s options."""

    def default(name: str) -> Any:
        return default_of(OriginSettings, name)

    def catalog(name: str) -> Any:
        return default_of(ObjectCatalog, name)

    parser.add_argument(
        "--address", default=default("address"), help="listen address (%(default)s)"
    )
    parser.add_argument(
        "--port", type=int, default=default("port"), help="listen port (%(default)s)"
    )
    parser.add_argument(
        "--objects", type=int, default=catalog("count"), help="number of objects (%(default)s)"
    )
    parser.add_argument(
        "--mean-size",
        type=int,
        default=catalog("mean_size"),
        help="mean size, bytes (%(default)s)",
    )
    parser.add_argument(
        "--min-size",
        type=int,
        default=catalog("min_size"),
        help="smallest size, bytes (%(default)s)",
    )
    parser.add_argument(
        "--max-age",
        type=int,
        default=default("max_age"),
        help="Cache-Control max-age (%(default)s)",
    )
    parser.add_argument("--pid-file", help="write the process id here")


def run_origin(args: argparse.Namespace) -> int:
    """The lab's origin, until SIGTERM or Ctrl-C."""
    import os  # noqa: PLC0415

    from lab.origin import serve  # noqa: PLC0415

    settings = origin_settings(args)
    if args.pid_file:
        with open(args.pid_file, "w") as handle:
            handle.write(f"{os.getpid()}\n")
    logs.configure("origin")
    return serve(settings)


def origin_settings(args: argparse.Namespace) -> OriginSettings:
    """The origin's settings from ``dnslb origin``'s options, checked."""
    settings = OriginSettings(
        address=args.address,
        port=args.port,
        objects=ObjectCatalog(count=args.objects, mean_size=args.mean_size, min_size=args.min_size),
        max_age=args.max_age,
    )
    return _checked(settings, ORIGIN_OPTIONS)


# -- problems named by option -----------------------------------------------------------------


def _checked(settings: _T, options: Mapping[str, str]) -> _T:
    """``settings`` when valid, else :class:`ConfigError` naming the options (``options``:
    field path -> option) instead of the fields."""
    with _options_named(options):
        return checked(settings, "invalid options")


@contextlib.contextmanager
def _options_named(options: Mapping[str, str]) -> Iterator[None]:
    """A :class:`ConfigError` raised inside names the options instead of the fields."""
    try:
        yield
    except ConfigError as exc:
        # An option that fills two fields (--boot-delay) would be named twice: once is enough.
        problems = dict.fromkeys(named(problem, options) for problem in exc.problems)
        raise ConfigError(exc.what, problems) from None


def named(problem: str, options: Mapping[str, str]) -> str:
    """``problem`` with each field path that has an option replaced by the option
    (``policy.k: must be at least 1, not 0`` -> ``--k: must be at least 1, not 0``)."""
    paths = sorted(options, key=len, reverse=True)
    pattern = re.compile(rf"(?<![\w.-])({'|'.join(map(re.escape, paths))})(?![\w.])")
    return pattern.sub(lambda match: options[match[1]], problem)
