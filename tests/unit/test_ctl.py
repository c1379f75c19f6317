"""``dnslb ctl`` against a running manager (real uvicorn, agents reporting over HTTP)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli.ctl import (
    EXIT_AUTH,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    Client,
    CtlError,
    show_events,
)
from cli.main import main
from daemons.process import free_port
from tests.api_support import ADMIN, AGENT, READ, RunningManager, running_manager


@pytest.fixture(scope="module")
def manager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningManager]:
    with running_manager(tmp_path_factory.mktemp("ctl")) as running:
        yield running


class Ctl:
    def __init__(self, url: str, capsys: pytest.CaptureFixture[str], mp: pytest.MonkeyPatch):
        self.url = url
        self.capsys = capsys
        self.mp = mp
        mp.setenv("DNSLB_API_TOKEN", ADMIN)

    def __call__(self, *args: str, token: str | None = None) -> tuple[int, str, str]:
        if token is not None:
            self.mp.setenv("DNSLB_API_TOKEN", token)
        self.capsys.readouterr()
        status = main(["ctl", "--url", self.url, *args])
        out, err = self.capsys.readouterr()
        return status, out, err


@pytest.fixture
def ctl(
    manager: RunningManager, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Ctl:
    return Ctl(manager.url, capsys, monkeypatch)


def test_status_pools_and_servers_as_tables(ctl: Ctl) -> None:
    status, out, _ = ctl("status")
    assert status == EXIT_OK
    assert "ready: yes" in out and "plan: v" in out
    assert "www.example.test" in out and "auto.example.test" in out

    status, out, _ = ctl("servers", "www")
    assert status == EXIT_OK
    header, *rows = out.strip().splitlines()
    assert header.split()[:4] == ["SERVER", "POOL", "ADDRESS", "STATE"]
    assert sorted(row.split()[0] for row in rows) == ["s1", "s2", "s3"]
    assert all(row.split()[1] == "www" for row in rows)
    columns = header.split()
    intended, delivered = columns.index("INTENDED"), columns.index("DELIVERED")
    paused = columns.index("PAUSED")
    for row in rows:
        cells = row.split()
        assert cells[delivered].endswith("%"), out
        # The agents' load is a wave, now and then above th_over: a paused server is in no
        # answer, so it has no intended share.
        if cells[paused] == "-":
            assert cells[intended].endswith("%"), out
        else:
            assert cells[intended] == "-", out
    assert any(row.split()[intended].endswith("%") for row in rows), out

    status, out, _ = ctl("pools", token=READ)
    assert status == EXIT_OK
    assert [line.split()[0] for line in out.strip().splitlines()[1:]] == ["www", "auto"]


def test_explain_a_name(ctl: Ctl) -> None:
    status, out, _ = ctl("explain", "www.example.test", token=READ)
    assert status == EXIT_OK, out
    lines = out.splitlines()
    assert lines[0].startswith("www.example.test (pool www): plan v")
    # the threshold follows the pool's mean utilization, which the agents' reports move
    assert re.fullmatch(
        r"k 2, TTL floor 5 s, fallback fail_open; (paused above (0\.8[0-9]|0\.9[0-9]|1\.00), "
        r"resumed below 0\.[789][0-9]|the pool's mean is at th_over 0\.8: none paused)",
        lines[1],
    ), lines[1]
    header = lines[3].split()
    assert header[:4] == ["SERVER", "ADDRESS", "STATE", "IN"] and header[-1] == "WHY"
    assert sorted(line.split()[0] for line in lines[4:7]) == ["s1", "s2", "s3"]
    assert lines[-1].startswith("A now: ") and "rotation" in lines[-1]

    status, out, _ = ctl("--json", "explain", "www")
    found = json.loads(out)
    assert found["pool"] == "www" and {m["id"] for m in found["members"]} == {"s1", "s2", "s3"}
    assert all(member["why"] for member in found["members"])

    status, _, err = ctl("explain", "nope.example.test")
    assert status == EXIT_REFUSED
    assert "no pool named 'nope.example.test'" in err


def test_json_output_is_the_api_document(ctl: Ctl) -> None:
    status, out, _ = ctl("--json", "servers")
    assert status == EXIT_OK
    servers = json.loads(out)
    assert {"s1", "s2", "s3"} <= {server["id"] for server in servers}
    assert {"state", "utilization", "weight", "ttl", "paused"} <= set(servers[0])


def test_actions_and_their_events(ctl: Ctl) -> None:
    status, out, _ = ctl("pause", "s1", "--reason", "ctl test")
    assert status == EXIT_OK
    assert out.startswith("s1: ") and "operator" in out
    status, out, _ = ctl("--json", "servers", "www")
    [s1] = [server for server in json.loads(out) if server["id"] == "s1"]
    assert s1["admin_paused"] is True
    status, out, _ = ctl("events", "--server", "s1", "--kind", "admin_pause", "--limit", "5")
    assert status == EXIT_OK
    assert "admin_pause" in out and "operator: ctl test" in out
    status, out, _ = ctl("resume", "s1")
    assert status == EXIT_OK and "operator" not in out


@pytest.mark.parametrize(
    ("args", "token", "exit_status", "said"),
    [
        pytest.param(("servers",), "wrong-token", EXIT_AUTH, "token not valid", id="401"),
        pytest.param(("servers",), AGENT, EXIT_AUTH, "token not valid", id="agent-token-401"),
        pytest.param(("drain", "s2"), READ, EXIT_AUTH, "admin role", id="403"),
        pytest.param(("pause", "nope"), ADMIN, EXIT_REFUSED, "no server 'nope'", id="404"),
        pytest.param(("enable", "s2"), ADMIN, EXIT_REFUSED, "(409)", id="409"),
        pytest.param(("events", "--limit", "0"), ADMIN, EXIT_REFUSED, "limit:", id="422"),
        pytest.param(("servers", "nope"), ADMIN, EXIT_REFUSED, "(404)", id="unknown-pool"),
    ],
)
def test_refusals_are_explained_with_exit_statuses(
    ctl: Ctl, args: tuple[str, ...], token: str, exit_status: int, said: str
) -> None:
    status, out, err = ctl(*args, token=token)
    assert status == exit_status
    assert out == ""
    assert said in err
    assert token not in err


def test_an_unreachable_manager(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DNSLB_API_TOKEN", ADMIN)
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["ctl", "--url", url, "--timeout", "2", "status"]) == EXIT_UNREACHABLE
    assert f"cannot reach the manager at {url}" in capsys.readouterr().err


def test_token_sources(
    manager: RunningManager,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("DNSLB_API_TOKEN", raising=False)
    assert main(["ctl", "--url", manager.url, "status"]) == EXIT_USAGE
    assert "no API token: set DNSLB_API_TOKEN" in capsys.readouterr().err

    monkeypatch.setenv("OPS_TOKEN", READ)
    assert main(["ctl", "--url", manager.url, "--token-env", "OPS_TOKEN", "pools"]) == EXIT_OK
    capsys.readouterr()

    token_file = tmp_path / "token"
    token_file.write_text(READ + "\n")
    args = ["ctl", "--url", manager.url, "--token-file", str(token_file), "pools"]
    assert main(args) == EXIT_OK
    capsys.readouterr()
    missing = ["ctl", "--url", manager.url, "--token-file", str(tmp_path / "none"), "pools"]
    assert main(missing) == EXIT_USAGE
    assert "cannot read" in capsys.readouterr().err


def test_events_show_a_state_change_by_its_states() -> None:
    def event(
        number: int, kind: str, change: tuple[str, str] | None, reason: str
    ) -> dict[str, Any]:
        before, after = change or (None, None)
        return {
            "id": number,
            "time": 1_700_000_000.0 + number,
            "kind": kind,
            "pool": "www",
            "server": "s1" if change else None,
            "from_state": before,
            "to_state": after,
            "reason": reason,
        }

    page = {
        "events": [
            event(2, "state", ("warming", "active"), "reporting"),
            event(1, "scale_out", None, "1: mean utilization 0.90"),
        ],
        "next_before_id": None,
    }
    header, change, scale = show_events(page).splitlines()
    assert header.split() == ["ID", "TIME", "KIND", "POOL", "SERVER", "CHANGE", "REASON"]
    assert "s1" in change and "warming -> active" in change and change.endswith("reporting")
    assert " - " in scale and scale.endswith("1: mean utilization 0.90")


def test_a_write_sent_to_a_standby_names_the_leader_and_fails() -> None:
    # A standby answers writes with 307 and no body: ctl used to take that for success.
    def standby(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            307, headers={"location": f"https://leader.test:8700{request.url.path}"}
        )

    transport = httpx.MockTransport(standby)
    with (
        Client("https://standby.test:8700", "t", transport=transport) as client,
        pytest.raises(CtlError) as refused,
    ):
        client.request("POST", "/v1/servers/s1/actions", body={"action": "pause"})
    assert "standby" in str(refused.value)
    assert "https://leader.test:8700/v1/servers/s1/actions" in str(refused.value)
    assert refused.value.exit_status == EXIT_REFUSED
