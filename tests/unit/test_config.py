"""The configuration machinery: YAML to frozen dataclasses, every problem with file and line."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from enum import StrEnum
from pathlib import Path
from typing import Literal

import pytest

from dnslb.config import Secret, load_config, parse_config, reference, setting
from dnslb.errors import ConfigError


class Colour(StrEnum):
    RED = "red"
    BLUE = "blue"


@dataclasses.dataclass(frozen=True)
class TcpCheck:
    """Connect to a port."""

    type: Literal["tcp"]
    port: int = setting(help="port to connect to", min=1, max=65535)


@dataclasses.dataclass(frozen=True)
class HttpCheck:
    """GET a path."""

    type: Literal["http"]
    path: str = setting("/", help="path")
    status: int = setting(200, help="expected status", min=100, max=599)


@dataclasses.dataclass(frozen=True)
class Item:
    """One item."""

    name: str = setting(help="its name")
    k: int = setting(4, help="how many", min=1, max=64)
    ratio: float = setting(0.5, help="a fraction", min=0.0, max=1.0)
    colour: Colour = setting(Colour.RED, help="a colour")
    check: TcpCheck | HttpCheck | None = setting(None, help="health check")
    ttl_min: int = setting(5, help="low")
    ttl_max: int = setting(60, help="high")

    def config_problems(self) -> Iterator[str]:
        if self.ttl_min > self.ttl_max:
            yield f"ttl_min ({self.ttl_min}) must not exceed ttl_max ({self.ttl_max})"


@dataclasses.dataclass(frozen=True)
class Top:
    """The whole file."""

    token: Secret = setting(help="a secret")
    items: tuple[Item, ...] = setting(default_factory=tuple, help="items")
    labels: Mapping[str, str] = setting(default_factory=dict, help="labels")
    debug: bool = setting(False, help="debug")
    note: str | None = setting(None, help="a note")


def test_a_valid_file_builds_frozen_objects(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKEN", "s3cret")
    top = parse_config(
        """
token: env:TOKEN
items:
  - name: a
    k: 8
    colour: blue
    check: {type: http, path: /health}
  - name: b
    check: {type: tcp, port: 80}
labels: {team: web}
""",
        Top,
    )
    assert top.token.reveal() == "s3cret"
    assert "s3cret" not in repr(top)
    assert top.items[0] == Item(
        name="a", k=8, colour=Colour.BLUE, check=HttpCheck(type="http", path="/health")
    )
    assert top.items[1].check == TcpCheck(type="tcp", port=80)
    assert dict(top.labels) == {"team": "web"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        top.debug = True  # type: ignore[misc]


def test_every_problem_is_reported_with_its_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MISSING_TOKEN", raising=False)
    text = """\
token: env:MISSING_TOKEN
items:
  - name: a
    k: 0
    colr: red
  - name: b
    ratio: 1.5
    check: {type: udp}
  - k: 3
    ttl_min: 90
debug: maybe
debug: true
"""
    with pytest.raises(ConfigError) as caught:
        parse_config(text, Top, source="app.yaml")
    assert caught.value.problems == [
        "app.yaml, line 1: token: environment variable MISSING_TOKEN is not set",
        "app.yaml, line 4: items[0].k: must be at least 1, not 0",
        "app.yaml, line 5: items[0].colr: unknown key (did you mean 'colour'?)",
        "app.yaml, line 7: items[1].ratio: must be at most 1.0, not 1.5",
        "app.yaml, line 8: items[1].check.type: must be one of http, tcp, not 'udp'",
        "app.yaml, line 9: items[2].name: missing",
        "app.yaml, line 11: debug: must be true or false, not 'maybe'",
        "app.yaml, line 12: debug: duplicate key",
    ]


def test_cross_field_rules_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"line 1: items\[0\]: ttl_min \(90\) must not exceed"):
        parse_config("{items: [{name: a, ttl_min: 90}], token: file:/dev/null}", Top)


@pytest.mark.parametrize(
    ("token", "problem"),
    [
        ("hunter2", "a secret must be a reference"),
        ("file:missing.txt", "cannot read"),
        ("'env:'", "a secret must be a reference"),
    ],
)
def test_secrets_must_be_references(tmp_path: Path, token: str, problem: str) -> None:
    path = tmp_path / "app.yaml"
    path.write_text(f"token: {token}\n")
    with pytest.raises(ConfigError, match=problem):
        load_config(path, Top)


def test_file_secrets_are_relative_to_the_config_file(tmp_path: Path) -> None:
    (tmp_path / "token.txt").write_text("from-a-file\n")
    path = tmp_path / "app.yaml"
    path.write_text("token: file:token.txt\n")
    assert load_config(path, Top).token.reveal() == "from-a-file"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("token: [unclosed", "line 1: not valid YAML"),
        ("- a list", "must be a mapping"),
        ("{token: env:X, items: {name: a}}", "items: must be a list"),
        ("{token: env:X, labels: [a]}", "labels: must be a mapping"),
        ("{token: env:X, items: [{name: [1, 2]}]}", "items[0].name: must be a single value"),
    ],
)
def test_malformed_documents(text: str, problem: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("X", "x")
    with pytest.raises(ConfigError) as caught:
        parse_config(text, Top)
    assert any(problem in p for p in caught.value.problems), caught.value.problems


def test_an_unreadable_file_is_one_clear_problem(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "nope.yaml", Top)


def test_reference_documents_every_field() -> None:
    text = reference(Top)
    for expected in ("`token`", "`items`", "`k`", "(1 to 64)", "`check`: TcpCheck", "`http`"):
        assert expected in text


def test_secret_files_are_regular_and_small(tmp_path: Path) -> None:
    """A secret file is a token or a password: /dev/zero, a FIFO or a huge file is refused
    without being read whole (an API body once made the manager read /dev/zero)."""
    import os  # noqa: PLC0415

    from dnslb.config import resolve_secret  # noqa: PLC0415

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    big = tmp_path / "big"
    big.write_bytes(b"x" * 5000)
    for path, problem in ((Path("/dev/zero"), "cannot read"), (fifo, "cannot read"), (big, "")):
        with pytest.raises(ValueError, match=problem or "larger"):
            resolve_secret(f"file:{path}")
    with pytest.raises(ValueError, match="refused here"):
        resolve_secret("file:/etc/hostname", refuse_files="refused here")
    good = tmp_path / "token"
    good.write_text("  a-token \n")
    assert resolve_secret(f"file:{good}").reveal() == "a-token"


def test_managers_sharing_one_file_each_give_their_own_url(tmp_path: Path) -> None:
    """``dnslb manager --advertise-url``: the file's http.advertise_url, by the file's rules."""
    from manager.config import load_manager_config  # noqa: PLC0415 - the manager's extra

    path = tmp_path / "manager.yaml"
    path.write_text(
        "zones: [{name: example.test, ns: [ns1.example.test]}]\n"
        "http: {advertise_url: 'http://127.0.0.1:1', peer_urls: ['http://127.0.0.1:2']}\n"
        "pools: []\n"
    )
    assert load_manager_config(path).config.http.url == "http://127.0.0.1:1"
    loaded = load_manager_config(path, advertise_url="http://127.0.0.1:2/")
    assert loaded.config.http.url == "http://127.0.0.1:2"
    assert loaded.config.http.peer_urls == ("http://127.0.0.1:2",)
    for url, problem in (
        ("ftp://127.0.0.1:2", "is not an http(s) URL"),
        ("http://", "is not an http(s) URL"),
        ("http://10.0.0.5:8700", "clear text"),  # the file's plaintext rule holds here too
    ):
        with pytest.raises(ConfigError) as raised:
            load_manager_config(path, advertise_url=url)
        assert raised.value.what == "--advertise-url"
        assert problem in " ".join(raised.value.problems)
