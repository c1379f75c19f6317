"""One exception handler: the project's errors and bad requests become clear JSON answers.

====================================  ======  =============================================
exception                             status  body
====================================  ======  =============================================
:class:`dnslb.control.NotFound`       404     ``{"error": ...}``
:class:`dnslb.control.Conflict`       409     ``{"error": ...}``
:class:`dnslb.errors.ConfigError`     422     ``{"error", "problems": [{field, message}]}``
request validation (FastAPI)          422     the same, one problem per field
HTTP errors (405, 413, ...)           as is   ``{"error": ...}``
any other :class:`DnslbError`         502     the manager could not carry it out
====================================  ======  =============================================

Every body is an :class:`api.models.ErrorBody`. Problems name the field they concern: a JSON path
into the body (``members[0].address``) or the parameter (``limit``); a submitted value is never
echoed back (it may be a secret).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.routing import BaseRoute

from api.models import ErrorBody, Problem
from dnslb.control import Conflict, NotFound
from dnslb.errors import ConfigError, DnslbError

log = logging.getLogger("dnslb.api")

_WHERE = re.compile(r"^[^:]*, line \d+: ")  # "pool, line 3: " from the config builder
_FIELD = re.compile(r"^([A-Za-z_@][\w@-]*(?:\[\d+\])*(?:\.[\w@-]+(?:\[\d+\])*)*): (.+)$", re.S)


def problem_of(text: str) -> Problem:
    """A config problem (``pool, line 3: members[0].id: ...``) as field and message."""
    text = _WHERE.sub("", text, count=1)
    field: str | None = None
    # A rule of a nested object names its own key: "members[0]: address: ..." is members[0].address
    while (match := _FIELD.match(text)) is not None:
        field = f"{field}.{match.group(1)}" if field else match.group(1)
        text = match.group(2)
    return Problem(field=field, message=text)


def _location(loc: Sequence[Any]) -> str:
    """FastAPI's error location as the client wrote it: ``members[0].id``, ``limit``."""
    parts = list(loc[1:]) if loc and loc[0] in ("body", "query", "path", "header") else list(loc)
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text or (str(loc[0]) if loc else "body")


def validation_problems(errors: Iterable[Mapping[str, Any]]) -> list[Problem]:
    problems = []
    for error in errors:
        loc = tuple(error.get("loc", ()))
        message = str(error.get("msg", "invalid"))
        if error.get("type") == "json_invalid":
            problems.append(Problem(field="body", message="not valid JSON"))
            continue
        if error.get("type") == "value_error":  # our own validators: their message alone
            message = message.removeprefix("Value error, ")
        if loc and loc[0] in ("query", "path", "header"):
            message = f"{loc[0]} parameter: {message}"
        problems.append(Problem(field=_location(loc), message=message))
    return problems


def _printable(text: str) -> str:
    """``text`` as valid UTF-8: an unpaired surrogate from a caller's input is shown escaped."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _answer(
    status: int,
    error: str,
    problems: list[Problem] | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    body = ErrorBody(
        error=_printable(error),
        problems=[
            Problem(
                field=_printable(p.field) if p.field else p.field, message=_printable(p.message)
            )
            for p in problems or []
        ],
    )
    extra = dict(headers or {})
    if status == 401:
        extra["WWW-Authenticate"] = 'Bearer realm="dnslb"'
    return JSONResponse(body.model_dump(), status_code=status, headers=extra or None)


async def handle_error(request: Request, exc: Exception) -> JSONResponse:
    """The one handler; registered for every class it maps."""
    if isinstance(exc, NotFound):
        return _answer(404, str(exc))
    if isinstance(exc, Conflict):
        return _answer(409, str(exc))
    if isinstance(exc, ConfigError):
        return _answer(422, exc.what, [problem_of(problem) for problem in exc.problems])
    if isinstance(exc, RequestValidationError):
        return _answer(422, "invalid request", validation_problems(exc.errors()))
    if isinstance(exc, HTTPException):
        detail = exc.detail if isinstance(exc.detail, str) else "request refused"
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = _allowed(request)
        return _answer(exc.status_code, detail, headers=headers)
    if isinstance(exc, DnslbError):
        log.error("%s %s failed: %s", request.method, request.url.path, exc)
        return _answer(502, f"the manager could not carry it out: {exc}")
    raise exc  # not ours: Starlette answers 500 and the error is logged once, there


def allow_methods(app: FastAPI, routes: Iterable[BaseRoute]) -> None:
    """Remember every route's methods, for the ``Allow`` header of 405 answers: Starlette lists
    only the first route matching the path, and a path may have a route per method."""
    app.state.methods = [
        (route.path_regex, frozenset(route.methods or ()))
        for route in routes
        if isinstance(route, APIRoute)
    ]


def _allowed(request: Request) -> str:
    path = request.url.path
    table: list[tuple[re.Pattern[str], frozenset[str]]] = getattr(request.app.state, "methods", [])
    methods: set[str] = set()
    for pattern, route_methods in table:
        if pattern.match(path):
            methods |= route_methods
    return ", ".join(sorted(methods))


def install(app: FastAPI) -> None:
    for kind in (DnslbError, RequestValidationError, HTTPException):
        app.add_exception_handler(kind, handle_error)
