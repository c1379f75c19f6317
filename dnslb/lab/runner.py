"""The local lab: PowerDNS with the pipe backend on a loopback port, serving a plan.

``dnslb lab`` copies the plan (the example plan unless told otherwise) into its work directory,
starts ``pdns_server`` with the pipe backend on 127.0.0.1, shows a few real answers, and keeps
running until Ctrl-C (or SIGTERM), when it stops PowerDNS and its coprocesses. Editing the plan
in the work directory changes the answers within a second.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

from dnslb.errors import ConfigError
from dnslb.pdns import PdnsServer, PdnsSettings
from dnslb.plan import Plan, parse_plan_json

EXAMPLE_PLAN = Path(__file__).resolve().parent.parent / "examples" / "plan.json"


def _say(text: str) -> None:
    print(text, flush=True)


def run_lab(args: argparse.Namespace) -> int:
    """Run the lab until interrupted (or once, with ``--once``); returns the exit status."""
    source = Path(args.plan) if args.plan else EXAMPLE_PLAN
    try:
        plan = parse_plan_json(source.read_bytes())
    except OSError as exc:
        raise ConfigError("lab", [f"{source}: cannot read the plan: {exc.strerror}"]) from None
    if not plan.pools:
        raise ConfigError("lab", [f"{source}: the plan has no pools to show"])

    own_workdir = args.workdir is None
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="dnslb-lab-")).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    plan_path = workdir / "plan.json"
    shutil.copyfile(source, plan_path)

    settings = PdnsSettings(plan=str(plan_path), port=args.dns_port)
    server = PdnsServer(settings, workdir / "pdns")
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        _say(f"[1/2] starting PowerDNS on 127.0.0.1:{args.dns_port} with the dnslb pipe backend")
        server.start(probe_name=plan.zones[0].name)
        _say(f"[2/2] PowerDNS answers; pdns log: {server.log_path}")
        _show_answers(plan, args.dns_port)
        if args.once:
            return 0
        pool = plan.pools[0].name
        _say(
            f"\nLab running. Plan: {plan_path} (edit it: answers change within a second)\n"
            f"Try:  dig @127.0.0.1 -p {args.dns_port} {pool} A\n"
            f"      pdnsutil --config-dir={server.workdir} backend-cmd pipe status\n"
            "Ctrl-C stops everything."
        )
        while server.process is not None and server.process.poll() is None:
            time.sleep(0.5)
        _say(f"PowerDNS exited unexpectedly:\n{server.log_tail()}")
        return 1
    except KeyboardInterrupt:
        _say("\nstopping")
        return 0
    finally:
        server.stop()
        if own_workdir:
            shutil.rmtree(workdir, ignore_errors=True)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _show_answers(plan: Plan, port: int) -> None:
    import dns.message  # noqa: PLC0415
    import dns.query  # noqa: PLC0415
    import dns.rcode  # noqa: PLC0415

    pool = plan.pools[0]
    zone = plan.zones[0].name
    questions = [(pool.name, "A")] * 6 + [(pool.name, "AAAA"), (zone, "SOA"), (zone, "NS")]
    questions.append((f"no-such-name.{zone}", "A"))
    _say(f"\nAnswers from 127.0.0.1:{port} (k={pool.k} addresses per answer, weighted):")
    for name, rtype in questions:
        reply = dns.query.udp(
            dns.message.make_query(name, rtype), "127.0.0.1", port=port, timeout=2
        )
        if not reply.answer:
            _say(f"  {name:<28} {rtype:<5} {dns.rcode.to_text(reply.rcode())}")
            continue
        for rrset in reply.answer:
            data = " ".join(
                sorted(str(rdata) for rdata in rrset)
                if rtype != "A"
                else [str(rdata) for rdata in rrset]
            )
            _say(f"  {name:<28} {rtype:<5} ttl={rrset.ttl:<5} {data}")
    sys.stdout.flush()
