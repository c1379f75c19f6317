"""``dnslb pdns-config``: the pdns.conf for the pipe backend (defaults: :class:`PdnsSettings`);
``dnslb pdns-dnssec-setup``: sign its zones (:mod:`daemons.dnssec`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from daemons.dnssec import secure_zone
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
    parser.add_argument(
        "--dnssec",
        default=None,
        metavar="DATABASE",
        help="sign answers with the zones' keys held in this gsqlite3 database (launch=pipe,"
        "gsqlite3); make them with dnslb pdns-dnssec-setup (default: unsigned)",
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
        dnssec_database=str(Path(args.dnssec).resolve()) if args.dnssec else None,
    )
    sys.stdout.write(render_config(settings, args.socket_dir))
    return 0


def add_pdns_dnssec_setup_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``dnslb pdns-dnssec-setup``."""
    parser.add_argument(
        "--config-dir",
        default="/etc/powerdns",
        help="directory of the pdns.conf rendered with dnslb pdns-config --dnssec (%(default)s)",
    )
    parser.add_argument("zones", nargs="+", metavar="ZONE", help="zones of the plan to sign")


def run_pdns_dnssec_setup(args: argparse.Namespace) -> int:
    """Sign each zone (keys made once, narrow NSEC3) and print the DS records for the parent."""
    for zone in args.zones:
        for line in secure_zone(args.config_dir, zone):
            print(line)
    return 0
