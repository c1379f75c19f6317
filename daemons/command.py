"""``dnslb pdns-config``: the pdns.conf for the pipe backend (defaults: :class:`PdnsSettings`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from daemons.pdns import PdnsSettings, render_config
from dnslb.config import default_of

DEFAULT_SOCKET_DIR = "/run/pdns"


def add_pdns_config_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``dnslb pdns-config``."""

    def default(name: str) -> object:
        return default_of(PdnsSettings, name)

    parser.add_argument(
        "--plan", required=True, help="plan the pipe backend serves (file path or redis:// URL)"
    )
    parser.add_argument(
        "--address", default=default("address"), help="address pdns listens on (%(default)s)"
    )
    parser.add_argument(
        "--port", type=int, default=default("port"), help="port pdns listens on (%(default)s)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=default("threads"),
        help="distributor threads, one pipe coprocess each (%(default)s)",
    )
    parser.add_argument(
        "--socket-dir", default=DEFAULT_SOCKET_DIR, help="pdns control socket directory"
    )
    parser.add_argument(
        "--redis-password-file",
        default=None,
        metavar="FILE",
        help="file holding the password of a redis:// plan, given to the pipe backend by path "
        "(a password in the URL is refused: pdns's pipe-command is visible in ps)",
    )
    parser.add_argument(
        "--state-dir",
        default=None,
        metavar="DIR",
        help="the pipe backend's state directory (its last good plan), writable by the pdns "
        "user (default: the pipe backend's, $STATE_DIRECTORY or ~/.local/state/dnslb/"
        "pipe-backend of the pdns user)",
    )
    parser.add_argument(
        "--explain",
        action="store_true",
        help="have the pipe backend answer TXT at _dnslb-explain.<pool name> with the pool's "
        "members, weights, TTLs and states (readable by anyone who can query pdns; off)",
    )


def run_pdns_config(args: argparse.Namespace) -> int:
    """Print the pdns.conf."""
    plan = args.plan if "://" in args.plan else str(Path(args.plan).resolve())
    password_file = args.redis_password_file
    settings = PdnsSettings(
        plan=plan,
        address=args.address,
        port=args.port,
        threads=args.threads,
        redis_password_file=str(Path(password_file).resolve()) if password_file else None,
        state_dir=str(Path(args.state_dir).resolve()) if args.state_dir else None,
        explain=args.explain,
    )
    sys.stdout.write(render_config(settings, args.socket_dir))
    return 0
