"""The exception tree: every exception of ours is under ``DnslbError`` and drawn in
``dnslb/errors.py``'s docstring."""

from __future__ import annotations

import ast
import asyncio
import builtins
import importlib
from pathlib import Path

import pytest
from starlette.requests import Request

from api.errors import handle_error
from cli.main import PACKAGES
from dnslb import errors
from dnslb.control import Conflict, NotFound
from dnslb.errors import ConfigError, DnslbError
from dnslb.resp import RedisBackoffError, RedisError, RedisTimeoutError

ROOT = Path(__file__).resolve().parents[2]
OUTSIDE = {"dnslb.fuzzing.Hang"}
"""Raised by a timer inside the code under test: no handler of ours may catch it."""

BUILTIN_EXCEPTIONS = {
    name
    for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, BaseException)
}


def exception_classes() -> list[tuple[str, str]]:
    """(module, class) of every public exception class defined in our packages (by their bases'
    names: a class whose base is a builtin exception or one of these)."""
    found: dict[str, tuple[str, list[str]]] = {}
    for package in sorted(PACKAGES):
        for path in sorted((ROOT / package).rglob("*.py")):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    bases = [ast.unparse(base).split(".")[-1] for base in node.bases]
                    found[node.name] = (module, bases)
    exceptions = set(BUILTIN_EXCEPTIONS)
    changed = True
    while changed:
        changed = False
        for name, (_, bases) in found.items():
            if name not in exceptions and any(base in exceptions for base in bases):
                exceptions.add(name)
                changed = True
    return sorted(
        (module, name)
        for name, (module, _) in found.items()
        if name in exceptions and not name.startswith("_")
    )


def test_the_tree_is_found() -> None:
    assert ("manager.ingest", "Rejected") in exception_classes()


@pytest.mark.parametrize(("module", "name"), exception_classes(), ids=lambda part: part)
def test_every_exception_is_under_the_root_and_drawn(module: str, name: str) -> None:
    cls = getattr(importlib.import_module(module), name)
    assert errors.__doc__ is not None
    assert name in errors.__doc__, f"{module}.{name} is missing from dnslb/errors.py's tree"
    if f"{module}.{name}" in OUTSIDE:
        assert not issubclass(cls, DnslbError)
    else:
        assert issubclass(cls, DnslbError), f"{module}.{name} is not a DnslbError"


def test_redis_errors_stay_os_errors() -> None:
    # plan store readers catch OSError for any store unreachable, file or Redis
    assert issubclass(RedisError, OSError)
    assert issubclass(RedisTimeoutError, TimeoutError)
    assert issubclass(RedisBackoffError, ConnectionError)


@pytest.mark.parametrize(
    ("error", "status"),
    [
        pytest.param(NotFound("no pool 'x'"), 404, id="not-found"),
        pytest.param(Conflict("pool 'x' exists"), 409, id="conflict"),
        pytest.param(ConfigError("pool", ["members[0].id: required"]), 422, id="config"),
        pytest.param(RedisError("READONLY"), 502, id="redis"),
    ],
)
def test_the_api_maps_the_tree_to_statuses(error: Exception, status: int) -> None:
    request = Request({"type": "http", "method": "POST", "path": "/v1/pools", "headers": []})
    answer = asyncio.run(handle_error(request, error))
    assert answer.status_code == status
