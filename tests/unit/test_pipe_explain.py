"""The pipe backend's debug TXT answer (``--explain``): off by default, bounded, never cached."""

from __future__ import annotations

import argparse
import random
import re
from pathlib import Path
from typing import Any

import pytest

from dnslb.plan_store import FilePlanStore
from pipe_backend.backend import PipeBackend
from pipe_backend.command import add_arguments
from pipe_backend.explain import MAX_MEMBERS, MAX_STRING, txt_content
from tests.conftest import plan_doc, write_plan
from tests.unit.test_pipe_backend import Clock, parse_reply, q_line

NAME = "_dnslb-explain.www.example.test"


def backend_for(path: Path, *, explain: bool, abi: int = 5) -> PipeBackend:
    clock = Clock()
    backend = PipeBackend(
        FilePlanStore(path), rng=random.Random(5), monotonic=clock, wall=clock, explain=explain
    )
    backend.poll(force=True)
    assert backend.handle(f"HELO\t{abi}".encode()).startswith(b"OK\t")
    return backend


def strings(content: str) -> bytes:
    """A TXT record's zone-file content (one quoted string) back to its bytes."""
    assert content.startswith('"') and content.endswith('"'), content
    body = content[1:-1]
    out = bytearray()
    for match in re.finditer(r'\\([0-9]{3})|\\(["\\])|([^\\"])', body):
        if match.group(1):
            out.append(int(match.group(1)))
        else:
            out += (match.group(2) or match.group(3)).encode("ascii")
    return bytes(out)


def txt(backend: PipeBackend, name: str = NAME, qtype: str = "TXT", abi: int = 5) -> list[Any]:
    return parse_reply(abi, backend.handle(q_line(abi, name, qtype)))


@pytest.fixture
def plan_path(tmp_path: Path) -> Path:
    path = tmp_path / "plan.json"
    write_plan(path, plan_doc())
    return path


def test_off_by_default(plan_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args(["--plan", str(plan_path)]).explain is False
    assert parser.parse_args(["--plan", str(plan_path), "--explain"]).explain is True
    backend = backend_for(plan_path, explain=False)
    assert txt(backend) == []
    assert txt(backend, qtype="ANY") == []


@pytest.mark.parametrize("abi", [1, 3, 5])
def test_the_txt_answer_says_the_plan_and_every_member(plan_path: Path, abi: int) -> None:
    backend = backend_for(plan_path, explain=True, abi=abi)
    records = txt(backend, abi=abi)
    assert {r["type"] for r in records} == {"TXT"}
    assert {r["ttl"] for r in records} == {0}  # never cached
    assert {r["scope"] for r in records} == {1 if abi >= 3 else 0}
    lines = [strings(r["content"]).decode() for r in records]
    assert lines[0] == (
        "dnslb plan v7 generated - stale no; k 2 ttl_floor 5 fallback fail_open; 6 members"
    )
    by_id = {line.split()[0]: line for line in lines[1:]}
    assert sorted(by_id) == ["a", "b", "c", "d", "p", "x"]
    # a has 4 of the 10 active weight: first in 40 % of the answers (k = 2).
    assert by_id["a"] == "a 10.0.0.1 active w=4 ttl=60 u=0.00 first=40% in=80%"
    assert by_id["p"].split()[2:4] == ["paused", "w=5"] and by_id["p"].endswith("in=0%")
    assert by_id["x"].split()[2] == "down"
    # ANY carries the same; the name in the client's letter case; other names untouched.
    assert txt(backend, qtype="ANY", abi=abi) == records
    upper = txt(backend, name=NAME.upper(), abi=abi)
    assert {r["name"] for r in upper} == {NAME.upper()}
    assert txt(backend, name="www.example.test", abi=abi) == []
    assert len(parse_reply(abi, backend.handle(q_line(abi, "www.example.test", "A")))) == 2


def test_it_follows_new_plans(plan_path: Path) -> None:
    backend = backend_for(plan_path, explain=True)
    write_plan(plan_path, plan_doc(version=8, generated_at=1_700_000_000.4))
    backend.poll(force=True)
    assert strings(txt(backend)[0]["content"]).startswith(b"dnslb plan v8 generated 1700000000 ")


def test_it_is_bounded_whatever_the_members(tmp_path: Path) -> None:
    doc = plan_doc()
    doc["pools"][0]["members"] = [
        {"id": f'm{index:02d}-"\\-\u00e9\u4e2d\U0001f600' + "z" * 110, "address": f"10.1.0.{index}"}
        for index in range(40)
    ]
    path = tmp_path / "plan.json"
    write_plan(path, doc)
    backend = backend_for(path, explain=True)
    records = txt(backend)
    assert len(records) == 1 + MAX_MEMBERS + 1
    assert strings(records[-1]["content"]) == b"... and 24 more members"
    for record in records:
        assert record["content"].isascii() and record["content"].isprintable()
        assert len(strings(record["content"])) <= MAX_STRING
    assert sum(len(r["content"]) for r in records) < 4096


def test_a_record_of_the_plan_at_that_name_wins(tmp_path: Path) -> None:
    doc = plan_doc()
    doc["zones"][0]["records"].append(
        {"name": NAME, "type": "TXT", "ttl": 60, "content": '"the operator\'s own"'}
    )
    path = tmp_path / "plan.json"
    write_plan(path, doc)
    records = txt(backend_for(path, explain=True))
    assert [r["content"] for r in records] == ['"the operator\'s own"']


@pytest.mark.parametrize(
    "text",
    ["plain", 'quote " and \\ backslash', "tab\tand\nnewline", "\u00e9\U0001f600", "x" * 400],
)
def test_txt_content_is_one_printable_quoted_string(text: str) -> None:
    content = txt_content(text)
    assert content.isascii() and content.isprintable()
    assert strings(content) == text.encode()[:MAX_STRING]


@pytest.mark.parametrize(
    "name",
    [
        "_dnslb-explain",
        "_dnslb-explain.",
        "_dnslb-explain.nowhere.test",
        "_dnslb-explain._dnslb-explain.www.example.test",
        "_DNSLB-EXPLAIN.\\000.example.test",
    ],
)
def test_other_names_get_nothing_and_never_fail(plan_path: Path, name: str) -> None:
    backend = backend_for(plan_path, explain=True)
    assert backend.handle(q_line(5, name, "TXT")) == b"END\n"
