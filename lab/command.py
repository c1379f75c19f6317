"""The lab's command lines: ``dnslb lab``, ``loadtest``, ``report``, ``experiments`` and
``origin``. The lab is one component: its runner, origin, load tests (locust), experiments and
report all live in :mod:`lab`.
"""

from __future__ import annotations

import argparse
import logging
import sys


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
    report.add_argument("--lab", help="the lab's directory (default: the lab's default)")
    report.add_argument("--loadtest", help="the load test's output (default: the newest)")
    report.add_argument("--out", help="where to write it (default LOADTEST/report)")
    report.add_argument("--name", default="lab run", help="the case's name in tables")
    report.set_defaults(handler=run_report)

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
    experiments.set_defaults(handler=run_experiments)

    origin = commands.add_parser("origin", help="the lab's origin web server (GET /objects/N)")
    origin.add_argument("--address", default="127.0.0.1", help="listen address (127.0.0.1)")
    origin.add_argument("--port", type=int, default=8000, help="listen port (8000)")
    origin.add_argument("--objects", type=int, default=100, help="number of objects (100)")
    origin.add_argument("--mean-size", type=int, default=10240, help="mean size, bytes (10240)")
    origin.add_argument("--min-size", type=int, default=2048, help="smallest size, bytes (2048)")
    origin.add_argument("--max-age", type=int, default=600, help="Cache-Control max-age (600)")
    origin.add_argument("--pid-file", help="write the process id here")
    origin.set_defaults(handler=run_origin)


def run_lab(args: argparse.Namespace) -> int:
    """Run the local lab until Ctrl-C."""
    from lab.runner import run_lab as run  # noqa: PLC0415

    return run(args)


def run_loadtest(args: argparse.Namespace) -> int:
    """A headless locust run against a running lab."""
    from lab.loadtest.run import main  # noqa: PLC0415

    return main(args)


def run_report(args: argparse.Namespace) -> int:
    """The paper's columns and plots of a lab run."""
    from lab.report import main  # noqa: PLC0415

    return main(args)


def run_experiments(args: argparse.Namespace) -> int:
    """The paper's cases replayed on the lab."""
    from lab.experiments import main  # noqa: PLC0415

    return main(args)


def run_origin(args: argparse.Namespace) -> int:
    import os  # noqa: PLC0415

    from dnslb.config import parse_config  # noqa: PLC0415
    from lab.objects import ObjectCatalog  # noqa: PLC0415
    from lab.origin import serve  # noqa: PLC0415

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
