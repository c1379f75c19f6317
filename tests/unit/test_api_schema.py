"""schemathesis against the API's OpenAPI document, in process over ASGI: generated requests,
valid and invalid, with an admin token; no answer may be a server error, every answer must be
documented (status, content type, body schema), and invalid requests must be refused.

The document itself needs a token (it lists every path), so it is loaded with the read token.
Generation is seeded: a fixed seed in the suite, ``DNSLB_TEST_SEED`` when ``scripts/explore``
runs it (tests/conftest.py)."""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.config import SchemathesisConfig
from schemathesis.core import NOT_SET
from schemathesis.python.asgi import shutdown_lifespans
from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance

from tests.api_support import ADMIN, READ, RUNTIME_POOL, ApiLab, bearer
from tests.conftest import suite_seed


class LazyApp:
    """The manager and its API, built at the ASGI lifespan's start, in the thread and event loop
    that serve them (the manager's SQLite connection belongs to its thread), closed at its end.
    The manager has published plans and has a runtime pool, so generated calls reach deep. Each
    lifespan is a fresh manager (schemathesis may end and start it again between tests)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.lab: ApiLab | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    self.lab = ApiLab(Path(tempfile.mkdtemp(dir=self.directory)))
                    await self.lab.control.create_pool(RUNTIME_POOL)
                    await self.lab.ready()
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    if self.lab is not None:
                        await self.lab.close()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        assert self.lab is not None, "served before the lifespan started"
        await self.lab.app(scope, receive, send)


_DIRECTORY = tempfile.TemporaryDirectory(prefix="dnslb-schemathesis-")
schema = schemathesis.openapi.from_asgi(
    "/openapi.json",
    LazyApp(Path(_DIRECTORY.name)),
    config=SchemathesisConfig(seed=suite_seed()),
    headers=bearer(READ),
)


@pytest.fixture(scope="module", autouse=True)
def _close_the_manager() -> Iterator[None]:
    yield
    shutdown_lifespans()
    _DIRECTORY.cleanup()


# Pool and member documents are built by the manager, which also checks what a JSON Schema
# cannot say (the zone is configured, th_low < th_high, addresses are IP addresses, a server id
# is free): a schema-valid document may get 422 there, so acceptance of valid data is not
# required of those three operations; every 422 must still name what is wrong.
BUILT_BY_THE_MANAGER = {
    ("POST", "/v1/pools"),
    ("PUT", "/v1/pools/{name}"),
    ("POST", "/v1/pools/{name}/members"),
}


def problems_are_named(ctx: Any, response: Any, case: Any) -> bool | None:
    """Every error answer is an ErrorBody; a 422 lists problems, each with a message."""
    if response.status_code < 400 or not response.headers.get("content-type", [""])[0].startswith(
        "application/json"
    ):
        return None
    body = response.json()
    assert isinstance(body, dict) and isinstance(body.get("error"), str) and body["error"]
    if response.status_code == 422:
        assert body["problems"], body
        assert all(problem["message"] for problem in body["problems"]), body
    return None


_DECIMAL = re.compile(r"-?[0-9]{1,40}")


def _served(value: Any) -> list[str]:
    """A query value as the request carries it: strings (lists repeat the key, None is left out)."""
    if value is None:
        return []
    if isinstance(value, list | tuple):
        return [text for item in value for text in _served(item)]
    return [str(value)]


def _valid_text(text: str, spec: dict[str, Any]) -> bool:
    kinds = [option for option in spec.get("anyOf", [spec]) if option.get("type") != "null"]
    for kind in kinds:
        if kind.get("type") == "string" and len(text) >= kind.get("minLength", 0):
            return True
        if kind.get("type") == "integer":
            if not _DECIMAL.fullmatch(text):  # the API takes decimal digits only (not "5.0")
                continue
            number = int(text)
            if kind.get("minimum", number) <= number <= kind.get("maximum", number):
                return True
        if kind.get("type") == "array" and _valid_text(text, kind.get("items", {})):
            return True
    return False


def query_is_valid_as_served(case: Any) -> bool:
    """True when a "negative" case's query, once serialized to strings, is valid after all
    (``kind=true`` is a valid kind): schemathesis does not always see through serialization."""
    if case.body not in (None, NOT_SET) or case.path_parameters or not case.query:
        return False
    operation = schema.raw_schema["paths"].get(case.path, {}).get(case.method.lower())
    if operation is None:
        return False
    specs = {p["name"]: p["schema"] for p in operation.get("parameters", []) if p["in"] == "query"}
    for name, value in case.query.items():
        texts = _served(value)
        if not texts:
            continue  # not sent at all
        if name not in specs:
            return False
        if not all(_valid_text(text, specs[name]) for text in texts):
            return False
    return True


def integer_written_as_fraction(case: Any) -> bool:
    """True when the query gives an integer parameter as ``20.0``: JSON Schema counts 20.0 as an
    integer, so schemathesis generates it as valid data, but the API takes integers in decimal
    digits only and refuses it (422) on purpose (a client meaning 20.5 must not get 20)."""
    operation = schema.raw_schema["paths"].get(case.path, {}).get(case.method.lower())
    if operation is None or not case.query:
        return False
    for parameter in operation.get("parameters", []):
        if parameter["in"] != "query" or parameter["name"] not in case.query:
            continue
        spec = parameter["schema"]
        kinds = {option.get("type") for option in spec.get("anyOf", [spec])} - {"null"}
        if kinds != {"integer"}:
            continue
        if any(not _DECIMAL.fullmatch(text) for text in _served(case.query[parameter["name"]])):
            return True
    return False


@schema.parametrize()
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
def test_the_api_keeps_its_schema_and_never_fails(case: Any) -> None:
    excluded = []
    if (case.method.upper(), case.path) in BUILT_BY_THE_MANAGER:
        excluded.append(positive_data_acceptance)
    negative = case.meta is not None and case.meta.generation.mode.is_negative
    if negative and query_is_valid_as_served(case):
        excluded.append(negative_data_rejection)
    if not negative and integer_written_as_fraction(case):
        excluded.append(positive_data_acceptance)
    case.call_and_validate(
        headers=bearer(ADMIN),
        excluded_checks=excluded,
        additional_checks=[problems_are_named],
    )
