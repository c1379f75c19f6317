"""The pipe backend's command line: ``python -m pipe_backend`` (what pdns's ``pipe-command``
runs) and ``dnslb pipe-backend`` take the same options, declared here once.

Importing this module costs the standard library only; the backend is imported when it runs.

The pipe backend's own files (its copy of the last good plan) go to its state directory,
``--state-dir`` (:func:`default_state_dir` when not given), never beside the plan: the plan's
directory need not be writable by PowerDNS's user, and serving ``examples/plan.json`` leaves the
checkout clean.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

DEFAULT_POLL_INTERVAL = 0.25


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``dnslb pipe-backend`` (and of ``python -m pipe_backend``)."""
    parser.add_argument(
        "--plan",
        required=True,
        help="plan location: a JSON file path, or redis://HOST:PORT/DB?key=NAME",
    )
    parser.add_argument(
        "--state-dir",
        default=None,
        metavar="DIR",
        help="directory for the pipe backend's own files, created if missing (default: "
        "$STATE_DIRECTORY as systemd sets it, else $XDG_STATE_HOME/dnslb/pipe-backend, else "
        "~/.local/state/dnslb/pipe-backend)",
    )
    parser.add_argument(
        "--last-good",
        default=None,
        metavar="PATH",
        help="where to keep a copy of the last plan loaded and compiled (default: a file in "
        "the state directory named after the plan)",
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
    parser.add_argument(
        "--explain",
        action="store_true",
        help="answer TXT queries for _dnslb-explain.<pool name> with the plan version and the "
        "pool's members, weights, TTLs and states (a debugging aid for the operator; anyone "
        "who can query this DNS server can read them: off by default)",
    )
    parser.add_argument("--seed", type=int, help="seed the rotation (tests only)")


def default_state_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """The state directory when ``--state-dir`` is not given: the first of ``$STATE_DIRECTORY``
    (systemd sets it for a unit with ``StateDirectory=``; PowerDNS passes its environment on to
    its coprocesses), else ``$XDG_STATE_HOME/dnslb/pipe-backend``, else
    ``~/.local/state/dnslb/pipe-backend``."""
    systemd = environ.get("STATE_DIRECTORY", "").split(":")[0]
    if systemd:
        return Path(systemd)
    base = environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "dnslb" / "pipe-backend"


def run(args: argparse.Namespace) -> int:
    """Serve pdns on stdin/stdout until it closes the pipe."""
    from dnslb import logs  # noqa: PLC0415
    from dnslb.errors import ConfigError  # noqa: PLC0415
    from dnslb.plan_store import (  # noqa: PLC0415
        FilePlanStore,
        last_good_store,
        open_store,
        read_regular_file,
    )
    from pipe_backend.backend import PipeBackend  # noqa: PLC0415

    logs.configure("pipe-backend")
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
    if args.last_good:
        last_good = FilePlanStore(args.last_good)
    else:
        state_dir = Path(args.state_dir) if args.state_dir else default_state_dir()
        # One that cannot be made is logged by the backend, once, when it first keeps a plan.
        with contextlib.suppress(OSError):
            state_dir.mkdir(parents=True, exist_ok=True)
        last_good = last_good_store(store, state_dir)
    backend = PipeBackend(
        store,
        last_good=last_good,
        rng=rng,
        poll_interval=args.poll_interval,
        explain=args.explain,
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
