"""``dnslb ctl``: operate a running manager through its REST API.

The command line is declared in :mod:`cli.main` (so ``dnslb --help`` lists it without importing
this module); :func:`run` carries it out with an httpx client. Output is a table for people, or
the API's JSON with ``--json``. The token comes from an environment variable (``--token-env``,
default ``DNSLB_API_TOKEN``) or a file (``--token-file``), never from the command line, where
other users of the machine could read it.

Exit status: 0 done; 1 the API refused the request (404, 409, 422, ...); 2 usage (no token);
3 authentication or role (401, 403); 4 the manager could not be reached or failed (5xx).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO
from urllib.parse import quote

from dnslb.errors import DnslbError

if TYPE_CHECKING:
    import ssl

    import httpx

DEFAULT_URL = "http://127.0.0.1:8700"
DEFAULT_TOKEN_ENV = "DNSLB_API_TOKEN"  # noqa: S105 (a variable's name, not a token)

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_AUTH = 3
EXIT_UNREACHABLE = 4


class CtlError(DnslbError):
    """A command that could not be carried out; ``exit_status`` says how."""

    def __init__(self, message: str, exit_status: int = EXIT_REFUSED) -> None:
        super().__init__(message)
        self.exit_status = exit_status


class Client:
    """The API over HTTP, with the token in the Authorization header."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        timeout: float = 10.0,
        verify: ssl.SSLContext | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        """``verify``: how an ``https://`` manager is verified (default: the system's trust
        store)."""
        import httpx  # noqa: PLC0415 (imported when a command runs, not to build the parser)

        from dnslb.tls import client_context  # noqa: PLC0415

        self.url = url.rstrip("/")
        self.http = httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token}", "User-Agent": "dnslb-ctl"},
            timeout=timeout,
            verify=verify or client_context(),
            transport=transport,
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
    ) -> Any:
        """The decoded JSON answer; :class:`CtlError` for any failure, with what to do."""
        import httpx  # noqa: PLC0415

        try:
            response = self.http.request(
                method, path, params=dict(params or {}), json=body if body is not None else None
            )
        except httpx.TransportError as exc:
            from dnslb.tls import verification_failure  # noqa: PLC0415

            reason = verification_failure(exc) or exc or type(exc).__name__
            raise CtlError(
                f"cannot reach the manager at {self.url}: {reason}", EXIT_UNREACHABLE
            ) from None
        if response.status_code >= 400:
            raise _refusal(response)
        if response.is_redirect:
            # A standby manager sends writes to the leader. Not followed: the token would go
            # wherever a Location says; the operator chooses where it goes.
            leader = response.headers.get("location", "")
            raise CtlError(
                f"{self.url} is a standby manager; the leader is at {leader or 'an unknown URL'}: "
                "run the command against the leader (--url)",
                EXIT_REFUSED,
            )
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError:
            raise CtlError(
                f"{self.url} answered {response.status_code} with a body that is not JSON: "
                "is it a dnslb manager?",
                EXIT_UNREACHABLE,
            ) from None


def _refusal(response: httpx.Response) -> CtlError:
    status = response.status_code
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        body = {}
    message = str(body.get("error") or response.reason_phrase or "refused")
    lines = [f"{message} ({status})"]
    for problem in body.get("problems") or []:
        if isinstance(problem, dict):
            field = problem.get("field")
            text = str(problem.get("message", ""))
            lines.append(f"  {field}: {text}" if field else f"  {text}")
    if status == 401:
        lines.append("  check the token (--token-env NAME or --token-file PATH)")
        return CtlError("\n".join(lines), EXIT_AUTH)
    if status == 403:
        lines.append("  this needs a token with the admin role")
        return CtlError("\n".join(lines), EXIT_AUTH)
    if status >= 500:
        return CtlError("\n".join(lines), EXIT_UNREACHABLE)
    return CtlError("\n".join(lines), EXIT_REFUSED)


def read_token(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> str:
    """The token from ``--token-file`` or the environment variable ``--token-env`` names."""
    if args.token_file:
        try:
            token = Path(args.token_file).read_text().strip()
        except OSError as exc:
            raise CtlError(f"cannot read {args.token_file}: {exc.strerror}", EXIT_USAGE) from None
        if not token:
            raise CtlError(f"{args.token_file} is empty", EXIT_USAGE)
        return token
    name = args.token_env or DEFAULT_TOKEN_ENV
    token = environ.get(name, "").strip()
    if not token:
        raise CtlError(
            f"no API token: set {name}, or pass --token-env NAME or --token-file PATH", EXIT_USAGE
        )
    return token


# -- output -----------------------------------------------------------------------------------


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns aligned on their widest cell."""
    widths = [len(header) for header in headers]
    for row in rows:
        widths = [max(width, len(cell)) for width, cell in zip(widths, row, strict=True)]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in [headers, *rows]
    ]
    return "\n".join(lines)


def _num(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _when(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def _by_state(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{state} {count}" for state, count in sorted(counts.items())) or "none"


def show_status(status: Mapping[str, Any], pools: Sequence[Mapping[str, Any]]) -> str:
    manager = status["manager"]
    age = manager["plan_age"]
    plan = f"v{manager['plan_version']}" + (f", {age:.1f} s old" if age is not None else "")
    reports = ", ".join(f"{k} {v}" for k, v in sorted(manager["reports"].items())) or "none yet"
    lines = [
        f"ready: {'yes' if manager['ready'] else 'no (waiting for reports)'}",
        f"plan: {plan}",
        f"ticks: last {manager['tick_seconds'] * 1000:.1f} ms, {manager['tick_errors']} errors",
        f"servers: {_by_state(status['servers'])}; paused {status['paused']}",
        f"reports: {reports}",
        "",
        show_pools(pools),
    ]
    return "\n".join(lines)


def show_pools(pools: Sequence[Mapping[str, Any]]) -> str:
    rows = [
        [
            pool["name"],
            pool["dns_name"],
            pool["source"],
            pool["provider"] or "-",
            _by_state(pool["servers"]),
            _num(pool["cost_seconds"], 0),
            str(pool["served"]),
            str(pool["scale_events"]),
            _num(pool["mean_ttl"], 1),
        ]
        for pool in pools
    ]
    headers = ["POOL", "DNS NAME", "SOURCE", "PROVIDER", "SERVERS", "COST S", "SERVED"]
    return table([*headers, "SCALED", "MEAN TTL"], rows)


def _paused(server: Mapping[str, Any]) -> str:
    marks = [
        name for name, key in (("policy", "paused"), ("operator", "admin_paused")) if server[key]
    ]
    return ",".join(marks) or "-"


def show_servers(servers: Sequence[Mapping[str, Any]]) -> str:
    rows = [
        [
            server["id"],
            server["pool"],
            server["address"],
            server["state"],
            _num(server["utilization"]),
            _num(server["weight"], 1),
            _share(server.get("intended_share")),
            _share(server.get("delivered_share")),
            _num(server["ttl"]),
            _paused(server),
            _num(server["cost_seconds"], 0),
            str(server["served"]),
        ]
        for server in servers
    ]
    headers = ["SERVER", "POOL", "ADDRESS", "STATE", "UTIL", "WEIGHT", "INTENDED", "DELIVERED"]
    return table([*headers, "TTL", "PAUSED", "COST S", "SERVED"], rows)


def _share(value: Any) -> str:
    """A share as a percentage (its weight's, or its load's, of its pool's)."""
    return f"{value * 100:.1f}%" if isinstance(value, float) else "-"


def show_server(server: Mapping[str, Any]) -> str:
    return (
        f"{server['id']}: {server['state']} ({server['state_reason']}); paused: {_paused(server)}"
    )


def show_events(page: Mapping[str, Any]) -> str:
    rows = [
        [
            str(event["id"]),
            _when(event["time"]),
            event["kind"],
            event["pool"] or "-",
            event["server"] or "-",
            _change(event),
            event["reason"],
        ]
        for event in page["events"]
    ]
    text = table(["ID", "TIME", "KIND", "POOL", "SERVER", "CHANGE", "REASON"], rows)
    if page.get("next_before_id") is not None:
        text += f"\n(more: --before-id {page['next_before_id']})"
    return text


def _change(event: Mapping[str, Any]) -> str:
    """A state change as ``warming -> active``; ``-`` for other events."""
    before, after = event.get("from_state"), event.get("to_state")
    if before is None and after is None:
        return "-"
    return f"{before or '?'} -> {after or '?'}"


def show_explanation(found: Mapping[str, Any]) -> str:
    """A name's members and why each is or is not answered, then one answer of now."""
    age = found["plan_age"]
    plan = f"plan v{found['plan_version']}" + (f", {age:.1f} s old" if age is not None else "")
    if found["stale"]:
        plan += ", stale: answers carry the TTL floor"
    lines = [
        f"{found['name']} (pool {found['pool']}): {plan}",
        f"k {found['k']}, TTL floor {found['ttl_floor']} s, fallback {found['fallback']}; "
        + (
            f"paused above {found['pause_above']:.2f}, resumed below {found['resume_below']:.2f}"
            if found.get("pause_above") is not None and found.get("resume_below") is not None
            else f"the pool's mean is at th_over {found['th_over']:g}: none paused"
        ),
        "",
    ]
    rows = [
        [
            member["id"],
            member["address"],
            member["state"] or "-",
            member["plan_state"] or "-",
            _num(member["utilization"]),
            _num(member["weight"], 1),
            _num(member["ttl"]),
            _paused(member),
            f"{member['first_share']:.0%}",
            f"{member['answer_share']:.0%}",
            member["why"],
        ]
        for member in found["members"]
    ]
    headers = ["SERVER", "ADDRESS", "STATE", "IN PLAN", "UTIL", "WEIGHT", "TTL", "PAUSED"]
    lines.append(table([*headers, "FIRST", "IN", "WHY"], rows))
    lines.append("")
    if not found["answers"]:
        lines.append("no answer: the published plan does not hold this pool yet")
    for answer in found["answers"]:
        addresses = " ".join(answer["addresses"]) or "no address (NODATA)"
        members = ", ".join(answer["members"])
        fallback = ", by the fallback" if answer["fallback"] else ""
        lines.append(
            f"{answer['family']} now: {addresses}"
            + (f" ({members})" if members else "")
            + f", TTL {answer['ttl']}{fallback}; one of {answer['rotation']} answers in the "
            "rotation (each pipe backend starts it at a random place)"
        )
    return "\n".join(lines)


# -- commands ---------------------------------------------------------------------------------

Command = Callable[[Client, argparse.Namespace], tuple[Any, str]]


def _status(client: Client, args: argparse.Namespace) -> tuple[Any, str]:
    status = client.request("GET", "/v1/status")
    pools = client.request("GET", "/v1/pools")
    return {"status": status, "pools": pools}, show_status(status, pools)


def _pools(client: Client, args: argparse.Namespace) -> tuple[Any, str]:
    pools = client.request("GET", "/v1/pools")
    return pools, show_pools(pools)


def _servers(client: Client, args: argparse.Namespace) -> tuple[Any, str]:
    params = {"pool": args.pool} if args.pool else {}
    servers = client.request("GET", "/v1/servers", params=params)
    return servers, show_servers(servers)


def _action(client: Client, args: argparse.Namespace) -> tuple[Any, str]:
    server = client.request(
        "POST",
        f"/v1/servers/{_segment(args.server)}/actions",
        body={"action": args.ctl_command, "reason": args.reason},
    )
    return server, show_server(server)


def _events(client: Client, args: argparse.Namespace) -> tuple[Any, str]:
    params: dict[str, Any] = {"limit": args.limit}
    for key in ("pool", "server", "kind", "before_id"):
        value = getattr(args, key)
        if value:
            params[key] = value
    page = client.request("GET", "/v1/events", params=params)
    return page, show_events(page)


def _explain(client: Client, args: argparse.Namespace) -> tuple[Any, str]:
    found = client.request("GET", f"/v1/explain/{_segment(args.name)}")
    return found, show_explanation(found)


def _segment(value: str) -> str:
    return quote(value, safe="")


COMMANDS: dict[str, Command] = {
    "status": _status,
    "pools": _pools,
    "servers": _servers,
    "events": _events,
    "explain": _explain,
    **dict.fromkeys(("pause", "resume", "disable", "enable", "drain"), _action),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options and commands of ``dnslb ctl``."""
    parser.add_argument("--url", help=f"manager URL (default $DNSLB_URL or {DEFAULT_URL})")
    parser.add_argument(
        "--ca-file",
        metavar="PATH",
        help="CA certificate(s) an https:// manager is verified with (default $DNSLB_CA_FILE, "
        "else the system's trust store)",
    )
    parser.add_argument(
        "--allow-plaintext",
        action="store_true",
        help="send the token in clear text to an http:// URL beyond this host",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--token-env",
        metavar="NAME",
        help="environment variable holding the API token (default DNSLB_API_TOKEN)",
    )
    source.add_argument("--token-file", metavar="PATH", help="file holding the API token")
    parser.add_argument("--json", action="store_true", help="print the API's JSON")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds (default 10)")
    actions = parser.add_subparsers(dest="ctl_command", required=True, metavar="COMMAND")
    actions.add_parser("status", help="readiness, plan, servers by state, pools")
    actions.add_parser("pools", help="pools with servers, cost, scale events")
    servers = actions.add_parser("servers", help="servers with state, load, weight, TTL")
    servers.add_argument("pool", nargs="?", help="only this pool's servers")
    for action, what in (
        ("pause", "leave a server out of answers (still measured) until resume"),
        ("resume", "clear an operator's pause"),
        ("disable", "take a server out whatever its health, until enable"),
        ("enable", "bring a disabled or drained server back (after a healthy report)"),
        ("drain", "take a server out of answers; a launched one is then terminated"),
    ):
        command = actions.add_parser(action, help=what)
        command.add_argument("server", metavar="ID", help="server id")
        command.add_argument("--reason", default="", help="kept in the event log")
    events = actions.add_parser("events", help="events, newest first")
    events.add_argument("--pool", help="only this pool's")
    events.add_argument("--server", help="only this server's")
    events.add_argument("--kind", action="append", help="only this kind (repeatable)")
    events.add_argument("--limit", type=int, default=20, help="how many (default 20)")
    events.add_argument("--before-id", type=int, help="older than this event id (paging)")
    explain = actions.add_parser(
        "explain", help="why a name answers as it does: members, weights, pauses, an answer now"
    )
    explain.add_argument("name", metavar="NAME", help="a pool's name or its DNS name")


def _verify(url: str, args: argparse.Namespace, environ: Mapping[str, str]) -> ssl.SSLContext:
    """The client's TLS context; :class:`CtlError` when ``url`` would carry the token in clear
    text beyond this host without ``--allow-plaintext``, or the CA file is unusable."""
    from dnslb.tls import client_context, plaintext_url_problem  # noqa: PLC0415

    problem = plaintext_url_problem("--url", url, getattr(args, "allow_plaintext", False))
    if problem:
        raise CtlError(
            problem.replace("set allow_plaintext: true", "pass --allow-plaintext"), EXIT_USAGE
        )
    ca_file = getattr(args, "ca_file", None) or environ.get("DNSLB_CA_FILE") or None
    try:
        return client_context(ca_file)
    except ValueError as exc:
        raise CtlError(str(exc), EXIT_USAGE) from None


def run(
    args: argparse.Namespace,
    *,
    out: TextIO | None = None,
    err: TextIO | None = None,
    environ: Mapping[str, str] = os.environ,
    transport: httpx.BaseTransport | None = None,
) -> int:
    """Carry out one ``dnslb ctl`` command; returns the exit status."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        token = read_token(args, environ)
        url = args.url or environ.get("DNSLB_URL") or DEFAULT_URL
        verify = _verify(url, args, environ)
        with Client(url, token, timeout=args.timeout, verify=verify, transport=transport) as client:
            document, text = COMMANDS[args.ctl_command](client, args)
    except CtlError as exc:
        print(f"dnslb ctl: {exc}", file=err)
        return exc.exit_status
    if args.json:
        out.write(json.dumps(document, indent=2) + "\n")
    else:
        out.write(text + "\n")
    return EXIT_OK
