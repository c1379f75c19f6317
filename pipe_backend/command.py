"""The pipe backend's command line: ``python -m pipe_backend`` (what pdns's ``pipe-command``
runs) and ``dnslb pipe-backend`` take the same options, declared here once.

Importing this module costs the standard library only; the backend is imported when it runs.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import random
import sys
from collections.abc import Sequence

DEFAULT_POLL_INTERVAL = 0.25


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``dnslb pipe-backend`` (and of ``python -m pipe_backend``)."""
    parser.add_argument(
        "--plan",
        required=True,
        help="plan location: a JSON file path, or redis://HOST:PORT/DB?key=NAME",
    )
    parser.add_argument(
        "--last-good",
        default=None,
        help="where to keep a copy of the last plan loaded (default: beside a plan file)",
    )
    parser.add_argument(
        "--redis-password-file",
        default=None,
        help="file holding the Redis password (else DNSLB_REDIS_PASSWORD)",
    )
    parser.add_argument(
        "--poll-interval",
        type=float,
        default=DEFAULT_POLL_INTERVAL,
        help=f"seconds between checks for a new plan (default {DEFAULT_POLL_INTERVAL})",
    )
    parser.add_argument("--seed", type=int, help="seed the rotation (tests only)")


def run(args: argparse.Namespace) -> int:
    """Serve pdns on stdin/stdout until it closes the pipe."""
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


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pipe_backend``: an expected error is one line on stderr and exit status 1."""
    from dnslb.errors import DnslbError  # noqa: PLC0415

    parser = argparse.ArgumentParser(
        prog="python -m pipe_backend",
        description="The PowerDNS pipe coprocess (pdns's pipe-command): answers load-balanced "
        "names from the plan.",
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except DnslbError as exc:
        print(f"dnslb pipe-backend: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
