"""Checks of a running compose lab, from the host and from inside its network.

``scripts/compose-lab-test`` brings the lab up and runs this (``python -m
tests.compose.check_lab``); it also works against a lab you started yourself. Each check prints
what it measured and PASS or FAIL; the last line counts them. Exit status 0 only when every
check passed. What is checked:

1. DNS: the load-balanced name through the ``dns`` service's published port (UDP and TCP);
2. HTTP to every address answered (from the host), the object's size as the origin made it, and
   a cache hit on the second request;
3. the same from inside the compose network (a client container resolving ``dns:5300``);
4. the REST API (status, servers, a refused call without the token), the metrics, the
   dashboard and its Chart.js;
5. a short ``locust --headless`` run in a one-off container on the lab network; then locust's
   master (web UI, two workers) running a step load started through its web API, with the
   sizes given here: requests, failures, DNS lookups;
6. autoscaling through the docker provider under that load: a scale-out event and a second
   cache server container in the answers;
7. the two managers on PostgreSQL: one leads, the other stands by, serves reads and redirects
   writes to the leader; the leader killed (SIGKILL), the standby leads in a new epoch while
   DNS goes on answering, and every cache server container is one the new leader knows; the
   killed manager back as a standby, then the new leader stopped cleanly: the first leads
   again and the cache servers run on, none stopped or started by the hand-over.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import dns.exception
import dns.message
import dns.query
import dns.rdatatype
import httpx

from lab.objects import ObjectCatalog

NAME = "www.lab.test"
ZONE = "lab.test"
HTTP_PORT = 8080

# What a client inside the lab network runs (the locust image has Python, dnspython, httpx).
INSIDE = """
import sys, dns.message, dns.query, dns.rdatatype, httpx, socket
server = socket.gethostbyname("dns")
reply = dns.query.udp(dns.message.make_query("www.lab.test", "A"), server, port=5300, timeout=3)
addresses = [str(r) for rrset in reply.answer if rrset.rdtype == dns.rdatatype.A for r in rrset]
status = httpx.get(f"http://{addresses[0]}:8080/objects/5", headers={"Host": "www.lab.test"},
                   timeout=30).status_code
print(f"{server} {addresses[0]} {status}")
"""


@dataclass
class Results:
    passed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    def check(self, name: str, ok: bool, measured: str) -> bool:
        (self.passed if ok else self.failed).append(name)
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {measured}", flush=True)
        return ok


@dataclass(frozen=True)
class Load:
    start_users: int
    step_users: int
    steps: int
    step_time: float
    hold: float


def resolve(server: str, port: int, *, tcp: bool = False) -> tuple[list[str], int]:
    query = dns.message.make_query(NAME, "A")
    if tcp:
        reply = dns.query.tcp(query, server, port=port, timeout=3)
    else:
        reply = dns.query.udp(query, server, port=port, timeout=3)
    for rrset in reply.answer:
        if rrset.rdtype == dns.rdatatype.A:
            return [str(rdata) for rdata in rrset], rrset.ttl
    return [], 0


def wait_for(predicate: Callable[[], bool], timeout: float, every: float = 1.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every)
    return predicate()


def check_dns_and_http(results: Results, server: str, port: int) -> list[str]:
    answers: list[str] = []

    def answered() -> bool:
        nonlocal answers
        try:
            answers, _ = resolve(server, port)
        except (OSError, dns.exception.DNSException):
            return False
        return bool(answers)

    started = time.monotonic()
    wait_for(answered, 90)
    waited = time.monotonic() - started
    addresses, ttl = resolve(server, port) if answers else ([], 0)
    results.check(
        "dns udp",
        bool(addresses) and 5 <= ttl <= 60,
        f"{NAME} -> {addresses} ttl {ttl} (first answer after {waited:.1f} s)",
    )
    tcp_addresses, tcp_ttl = resolve(server, port, tcp=True) if addresses else ([], 0)
    results.check("dns tcp", bool(tcp_addresses), f"{NAME} -> {tcp_addresses} ttl {tcp_ttl}")
    catalog = ObjectCatalog()
    for address in addresses:
        index = 7
        url = f"http://{address}:{HTTP_PORT}{catalog.path(index)}"
        try:
            first = httpx.get(url, headers={"Host": NAME}, timeout=30)
            second = httpx.get(url, headers={"Host": NAME}, timeout=30)
        except httpx.HTTPError as exc:
            results.check(f"http {address}", False, f"{url}: {type(exc).__name__}: {exc}")
            continue
        size = catalog.size(index)
        results.check(
            f"http {address}",
            first.status_code == 200
            and len(first.content) == size
            and second.headers.get("X-Cache-Status") == "HIT",
            f"GET {url}: {first.status_code}, {len(first.content)} bytes (origin's: {size}), "
            f"{first.elapsed.total_seconds():.2f} s; again: {second.status_code} "
            f"X-Cache-Status {second.headers.get('X-Cache-Status')}",
        )
    return addresses


def check_inside(results: Results, compose: list[str]) -> None:
    command = [*compose, "exec", "-T", "locust-master", "python3", "-c", INSIDE]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    words = done.stdout.split()
    results.check(
        "inside the lab network",
        done.returncode == 0 and len(words) == 3 and words[2] == "200",
        f"dns service at {words[0] if words else '?'}, first answer {words[1:2]}, HTTP "
        f"{words[2:3]}" + (f"; stderr: {done.stderr.strip()[-300:]}" if done.returncode else ""),
    )


def check_headless(results: Results, compose: list[str], seconds: int) -> None:
    """locust --headless in a one-off container of the locust image, on the lab network."""
    command = [
        *compose,
        "run",
        "--rm",
        "-T",
        "--no-deps",
        "locust-master",
        "locust",
        "--locustfile=/opt/dnslb/src/lab/loadtest/locustfile.py",
        "--headless",
        "--only-summary",
        "--json",
        "--loglevel=WARNING",
        "--progress=0",
        "--dns-server=dns:5300",
        f"--lb-name={NAME}",
        f"--http-port={HTTP_PORT}",
        "--start-users=10",
        "--step-users=0",
        "--steps=0",
        f"--step-time={seconds}",
        "--hold=0",
    ]
    started = time.monotonic()
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=seconds + 90, check=False
    )
    elapsed = time.monotonic() - started
    try:
        rows = {row["name"]: row for row in json.loads(done.stdout[done.stdout.index("[") :])}
    except ValueError:
        rows = {}
    http = rows.get("/objects/[n]", {})
    requests, failures = int(http.get("num_requests", 0)), int(http.get("num_failures", 0))
    lookups = int(rows.get(NAME, {}).get("num_requests", 0))
    results.check(
        "locust --headless",
        done.returncode == 0 and requests >= 3 * seconds and failures == 0 and lookups >= 10,
        f"10 users for {seconds} s in a one-off container ({elapsed:.0f} s in all): {requests} "
        f"HTTP requests, {failures} failed, {lookups} DNS lookups, exit {done.returncode}"
        + (f"; stderr: {done.stderr.strip()[-300:]}" if done.returncode or not rows else ""),
    )


def check_api(results: Results, api: str, token: str, addresses: list[str]) -> None:
    auth = {"Authorization": f"Bearer {token}"}
    status = httpx.get(f"{api}/v1/status", headers=auth, timeout=10)
    body = status.json() if status.status_code == 200 else {}
    results.check(
        "api status",
        status.status_code == 200 and body.get("manager", {}).get("ready") is True,
        f"GET /v1/status: {status.status_code} {json.dumps(body)[:200]}",
    )
    refused = httpx.get(f"{api}/v1/status", timeout=10)
    results.check("api refuses no token", refused.status_code == 401, f"{refused.status_code}")
    servers = httpx.get(f"{api}/v1/servers", headers=auth, timeout=10).json()
    docker = [s for s in servers if s["origin"] == "docker"]
    active = sorted(s["address"] for s in docker if s["state"] == "active")
    results.check(
        "api servers",
        bool(active) and set(addresses) <= set(active),
        f"{len(docker)} docker servers, active at {active}; DNS answered {addresses}",
    )
    metrics = httpx.get(f"{api}/metrics", headers=auth, timeout=10)
    results.check(
        "metrics",
        metrics.status_code == 200 and "dnslb_" in metrics.text,
        f"GET /metrics: {metrics.status_code}, {len(metrics.text.splitlines())} lines",
    )
    page = httpx.get(f"{api}/dashboard/", timeout=10)
    chart = httpx.get(f"{api}/dashboard/vendor/chart.umd.js", timeout=10)
    script = httpx.get(f"{api}/dashboard/dashboard.js", timeout=10)
    results.check(
        "dashboard",
        page.status_code == 200
        and "<html" in page.text.lower()
        and chart.status_code == 200
        and len(chart.content) > 100_000
        and script.status_code == 200,
        f"/dashboard/ {page.status_code} ({len(page.content)} bytes), Chart.js "
        f"{chart.status_code} ({len(chart.content)} bytes), dashboard.js {script.status_code}",
    )


def check_load(
    results: Results, locust: str, api: str, token: str, dns_server: str, dns_port: int, load: Load
) -> None:
    page = httpx.get(f"{locust}/", timeout=10)
    stats = httpx.get(f"{locust}/stats/requests", timeout=10).json()
    results.check(
        "locust web ui",
        page.status_code == 200 and stats.get("worker_count") == 2,
        f"GET /: {page.status_code}; state {stats.get('state')}, "
        f"{stats.get('worker_count')} workers",
    )
    form = {
        "user_count": "1",  # required by the form; the step shape decides the users
        "spawn_rate": "1",
        "start_users": str(load.start_users),
        "step_users": str(load.step_users),
        "steps": str(load.steps),
        "step_time": str(load.step_time),
        "hold": str(load.hold),
    }
    started = time.monotonic()
    swarm = httpx.post(f"{locust}/swarm", data=form, timeout=10).json()
    if not results.check("locust swarm", swarm.get("success") is True, str(swarm.get("message"))):
        return
    duration = (load.steps + 1) * load.step_time + load.hold
    widest: list[str] = []
    peak_users = 0
    while time.monotonic() - started < duration + 60:
        time.sleep(2)
        stats = httpx.get(f"{locust}/stats/requests", timeout=10).json()
        peak_users = max(peak_users, int(stats.get("user_count") or 0))
        try:
            answer, _ = resolve(dns_server, dns_port)
        except (OSError, dns.exception.DNSException):
            answer = []
        if len(answer) > len(widest):
            widest = answer
        if stats.get("state") == "stopped" and time.monotonic() - started > duration / 2:
            break
    elapsed = time.monotonic() - started
    rows = {row["name"]: row for row in stats["stats"]}
    http = rows.get("/objects/[n]", {})
    lookups = rows.get(NAME, {})
    requests = int(http.get("num_requests", 0))
    failures = int(http.get("num_failures", 0))
    results.check(
        "locust load",
        stats.get("state") == "stopped"
        and requests >= 10 * load.start_users
        and failures <= requests // 100
        and int(lookups.get("num_requests", 0)) >= load.start_users,
        f"{elapsed:.0f} s, up to {peak_users} users on 2 workers: {requests} HTTP requests, "
        f"{failures} failed, mean {float(http.get('avg_response_time', 0)) / 1000:.2f} s, "
        f"{float(http.get('current_rps', 0)):.1f} req/s at the end; "
        f"{lookups.get('num_requests', 0)} DNS lookups",
    )
    events = httpx.get(
        f"{api}/v1/events",
        params={"kind": "scale_out"},
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    ).json()["events"]
    results.check(
        "autoscaling",
        bool(events) and len(widest) >= 2,
        f"{len(events)} scale-out events ({'; '.join(e['reason'] for e in events[:2])}); "
        f"widest answer under load: {widest}",
    )


def role(api: str) -> tuple[str, int] | None:
    """(role, epoch) from a manager's /healthz (no token, no database); None if it is down."""
    try:
        document = httpx.get(f"{api}/healthz", timeout=2).json()
        return str(document["role"]), int(document["epoch"])
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None


def containers() -> dict[str, str]:
    """The cache server containers running: server id -> container id (the docker CLI)."""
    out = subprocess.run(
        [
            "docker",
            "ps",
            "--filter",
            "label=dnslb.managed-by",
            "--format",
            '{{.Label "dnslb.server-id"}} {{.ID}}',
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    return dict(line.split() for line in out.splitlines() if line.strip())


def known(api: str, token: str) -> set[str]:
    """The docker servers a manager knows and has not terminated."""
    auth = {"Authorization": f"Bearer {token}"}
    servers = httpx.get(f"{api}/v1/servers", headers=auth, timeout=10).json()
    return {s["id"] for s in servers if s["origin"] == "docker" and s["state"] != "terminated"}


def check_managers(
    results: Results,
    apis: tuple[str, str],
    token: str,
    dns_server: str,
    dns_port: int,
    compose: list[str],
) -> None:
    first, second = apis
    leading, standing = role(first), role(second)
    if not results.check(
        "managers: leader and standby",
        leading is not None and leading[0] == "leader" and standing == ("standby", 0),
        f"manager-1 {leading}, manager-2 {standing}",
    ):
        return
    assert leading is not None
    epoch = leading[1]
    auth = {"Authorization": f"Bearer {token}"}
    write = httpx.post(
        f"{second}/v1/servers/none/actions", json={"action": "pause"}, headers=auth, timeout=10
    )
    reads = httpx.get(f"{second}/v1/servers", headers=auth, timeout=10)
    results.check(
        "standby redirects writes, serves reads",
        write.status_code == 307
        and write.headers.get("location") == "http://manager-1:8700/v1/servers/none/actions"
        and reads.status_code == 200,
        f"POST at manager-2: {write.status_code} to {write.headers.get('location')}; "
        f"GET /v1/servers: {reads.status_code}, {len(reads.json())} servers",
    )

    # kill -9 the leader; DNS keeps answering from the last plan while the standby takes over
    subprocess.run([*compose, "kill", "manager-1"], check=True, capture_output=True, timeout=60)
    killed = time.monotonic()
    asked = answered = 0
    took = None
    while time.monotonic() - killed < 30:
        asked += 1
        with contextlib.suppress(OSError, dns.exception.DNSException):
            answered += bool(resolve(dns_server, dns_port)[0])
        if took is None and role(second) == ("leader", epoch + 1):
            took = time.monotonic() - killed
        if took is not None and time.monotonic() - killed > took + 3:
            break  # and a few seconds of the new leader's plans
        time.sleep(0.2)
    results.check(
        "leader killed: the standby leads",
        took is not None and answered == asked,
        f"manager-2 led in epoch {epoch + 1} {took or 0:.1f} s after SIGKILL to manager-1 "
        f"(lease 3 s); DNS answered {answered} of {asked} queries meanwhile",
    )
    running, leader_knows = containers(), known(second, token)
    results.check(
        "no cache server orphaned",
        bool(running) and set(running) <= leader_knows,
        f"containers of {sorted(running)}; manager-2 knows {sorted(leader_knows)}",
    )

    # back as a standby, then the new leader stopped cleanly: it hands the servers over
    subprocess.run([*compose, "start", "manager-1"], check=True, capture_output=True, timeout=60)
    back = wait_for(lambda: role(first) == ("standby", 0), 60, every=0.5)
    before = containers()
    subprocess.run([*compose, "stop", "manager-2"], check=True, capture_output=True, timeout=90)
    leads = wait_for(lambda: role(first) == ("leader", epoch + 2), 30, every=0.2)
    after = containers()
    results.check(
        "leader stopped cleanly: the standby takes the servers as they are",
        back and leads and before == after and bool(after),
        f"manager-1 back as a standby: {back}, leads in epoch {epoch + 2}: {leads}; "
        f"containers before {sorted(before.values())}, after {sorted(after.values())}",
    )
    subprocess.run([*compose, "start", "manager-2"], check=True, capture_output=True, timeout=60)
    results.check(
        "both managers back",
        wait_for(lambda: role(second) == ("standby", 0), 60, every=0.5),
        f"manager-1 {role(first)}, manager-2 {role(second)}",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dns", required=True, help="ADDRESS:PORT of the published DNS")
    parser.add_argument("--api", required=True, help="manager-1's published URL")
    parser.add_argument("--api-2", required=True, help="manager-2's published URL")
    parser.add_argument("--locust", required=True, help="locust's published web UI URL")
    parser.add_argument("--token-file", required=True, help="the API token, in a file")
    parser.add_argument(
        "--compose", required=True, help="the compose command, e.g. 'docker-compose -p lab'"
    )
    parser.add_argument("--start-users", type=int, default=30)
    parser.add_argument("--step-users", type=int, default=15)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--step-time", type=float, default=20.0)
    parser.add_argument("--hold", type=float, default=20.0)
    args = parser.parse_args(argv)
    server, _, port = args.dns.rpartition(":")
    token = Path(args.token_file).read_text().strip()
    load = Load(args.start_users, args.step_users, args.steps, args.step_time, args.hold)
    results = Results()
    try:
        addresses = check_dns_and_http(results, server, int(port))
        check_inside(results, args.compose.split())
        check_api(results, args.api.rstrip("/"), token, addresses)
        check_headless(results, args.compose.split(), seconds=15)
        check_load(
            results, args.locust.rstrip("/"), args.api.rstrip("/"), token, server, int(port), load
        )
        apis = (args.api.rstrip("/"), args.api_2.rstrip("/"))
        check_managers(results, apis, token, server, int(port), args.compose.split())
    except (httpx.HTTPError, OSError, ValueError, KeyError, subprocess.SubprocessError) as exc:
        results.check("checks ran to the end", False, f"{type(exc).__name__}: {exc}")
    print(f"compose-lab: {len(results.passed)} passed, {len(results.failed)} failed")
    return 0 if not results.failed else 1


if __name__ == "__main__":
    sys.exit(main())
