"""``dnslb manager``: run the manager from its configuration file.

What serves the REST API beside it is not the manager's to know: the composition root
(:mod:`cli.main`) passes it in as ``attach``.
"""

from __future__ import annotations

import argparse
import gc
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from manager.service import Manager

LOG_LEVELS = ("debug", "info", "warning", "error")

# Young objects collected once per this many allocations (Python's default: 700). A tick at
# 10,000 servers makes hundreds of thousands of short-lived objects; at 700 they were examined
# and promoted again and again while the tick still held them, and every few ticks a full
# collection went over the whole fleet's state (bench/manager_load.py).
_YOUNG_THRESHOLD = 20_000


def tune_collector() -> None:
    """Set the garbage collector up for a long-running manager, once its state is loaded: what
    exists now (configuration, fleet, state) is moved out of the collector's sight
    (``gc.freeze``) and young objects are collected less often. Measured at 10,000 servers: the
    collector's share of a tick went from 26-54 ms to 4-16 ms (bench/README.md)."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(_YOUNG_THRESHOLD, middle, old)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``dnslb manager``."""
    parser.add_argument("--config", required=True, help="manager configuration (YAML)")
    parser.add_argument("--check", action="store_true", help="validate the config and exit")
    parser.add_argument(
        "--advertise-url",
        metavar="URL",
        help="this manager's own URL, instead of the file's http.advertise_url (managers in "
        "active/standby sharing one configuration file: docs/high-availability.md)",
    )
    parser.add_argument("--log-level", default="info", choices=LOG_LEVELS)


def run(args: argparse.Namespace, attach: Callable[[Manager], None] | None = None) -> int:
    """Load the configuration and run the manager until SIGINT/SIGTERM; ``attach`` is called
    with the manager before it starts (to serve the API from its listener)."""
    import asyncio  # noqa: PLC0415
    import signal  # noqa: PLC0415

    from dnslb import logs  # noqa: PLC0415
    from manager.config import load_manager_config  # noqa: PLC0415
    from manager.service import Manager  # noqa: PLC0415

    logs.configure("manager", args.log_level, pid=False, timestamps=True)
    loaded = load_manager_config(args.config, advertise_url=args.advertise_url)
    if args.check:
        print(f"{args.config}: ok")
        return 0

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        manager = Manager(loaded)
        tune_collector()
        if attach is not None:
            attach(manager)
        await manager.run(stop)

    asyncio.run(main())
    return 0
