"""``dnslb sim``: its options, turned into :func:`sim.runner.main`'s arguments."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``dnslb sim``."""
    parser.add_argument(
        "scenarios", nargs="*", metavar="SCENARIO", help="scenario files (or shipped names)"
    )
    parser.add_argument("--suite", help="run a named set of shipped scenarios: paper, goals...")
    parser.add_argument("--seed", type=int, help="seed every run with this (default: its own)")
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs per case with successive seeds, averaged"
    )
    parser.add_argument("--out", help="directory for results and plots")
    parser.add_argument("--no-plots", action="store_true", help="write results without plots")
    parser.add_argument("--jobs", type=int, default=0, help="worker processes (default: CPUs)")


def run(args: argparse.Namespace) -> int:
    """Run the scenarios asked for."""
    from sim.runner import main  # noqa: PLC0415

    return main(
        args.scenarios,
        suite=args.suite,
        seed=args.seed,
        repeat=args.repeat,
        out=args.out,
        jobs=args.jobs,
        plots=not args.no_plots,
    )
