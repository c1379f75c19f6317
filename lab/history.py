"""What the manager says happened during a lab run, read through its REST API and kept in files.

The report needs the manager's events (scale decisions, every server's state changes) and its
servers (their addresses and launch times) after the lab has stopped. It never opens the
manager's database: while the lab runs, :class:`ManagerHistory` asks the manager's API, as any
client does (``GET /v1/events`` paged with ``before_id``, ``GET /v1/servers``, with the lab's
token), and appends what is new to two files in the lab's directory:

- ``events.jsonl``: every event, oldest first, as ``/v1/events`` gives it (``id``, ``time``,
  ``kind``, ``pool``, ``server``, ``from_state``, ``to_state``, ``reason``);
- ``servers.jsonl``: a server (``id``, ``pool``, ``address``, ``created_at``) when the API first
  shows it with an address, and again if its address changes.

The lab polls every second and once more just before it stops the manager. A run kept with
``--keep-state`` goes on with the same database, so the files go on where they stopped.
:func:`read_events` and :func:`read_servers` read them back (a line cut short by a killed lab
ends a file).
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dnslb.errors import ProcessError
from dnslb.model import Event, ServerState

EVENTS_FILE = "events.jsonl"
SERVERS_FILE = "servers.jsonl"
PAGE = 1000  # events a page: the API's largest


def event_of(document: Mapping[str, Any]) -> Event:
    """An event from the API's document (:class:`dnslb.model.Event`, its id set); a
    ``ValueError`` or ``KeyError`` when it is not one."""
    return Event(
        id=int(document["id"]),
        time=float(document["time"]),
        kind=str(document["kind"]),
        reason=str(document["reason"]),
        pool=_text(document.get("pool")),
        server=_text(document.get("server")),
        from_state=_state(document.get("from_state")),
        to_state=_state(document.get("to_state")),
    )


def _id(event: Event) -> int:
    return event.id or 0  # events from the API and the files always have theirs


@dataclass(frozen=True, slots=True)
class ServerSeen:
    """A server as the API showed it: what the report needs beyond its events."""

    id: str
    pool: str
    address: str
    created_at: float  # unix seconds: when its launch was asked


class ManagerApi:
    """The few calls of the manager's REST API the lab makes (bearer token, JSON answers)."""

    def __init__(self, url: str, token: str, *, timeout: float = 5.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout

    def get(self, path: str, params: Mapping[str, object] | None = None) -> Any:
        """The decoded JSON of ``GET path``; :class:`ProcessError` when the call fails."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        request = urllib.request.Request(  # noqa: S310 (the lab's own http URL)
            f"{self.url}{path}{query}", headers={"Authorization": f"Bearer {self.token}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as answer:  # noqa: S310
                return json.loads(answer.read())
        except (OSError, ValueError) as exc:
            raise ProcessError(f"the manager's API: GET {path}: {exc}") from None

    def events_after(self, last_id: int) -> list[Event]:
        """Every event with an id above ``last_id``, oldest first (paged newest first)."""
        found: list[Event] = []
        before: int | None = None
        while True:
            params: dict[str, object] = {"limit": PAGE}
            if before is not None:
                params["before_id"] = before
            page = self.get("/v1/events", params)
            events = [event_of(document) for document in page["events"]]
            found += [event for event in events if _id(event) > last_id]
            before = page.get("next_before_id")
            if before is None or before <= last_id + 1:
                break
        return sorted(found, key=_id)

    def servers(self) -> list[ServerSeen]:
        """The servers the manager tracks now (terminated ones are forgotten soon)."""
        return [
            ServerSeen(
                id=str(item["id"]),
                pool=str(item["pool"]),
                address=str(item["address"]),
                created_at=float(item["created_at"]),
            )
            for item in self.get("/v1/servers")
        ]


class ManagerHistory:
    """Appends the manager's new events and servers to the lab's files (see the module
    docstring). :meth:`poll` is called from one thread at a time."""

    def __init__(self, api: ManagerApi, directory: Path) -> None:
        self.api = api
        self.events_path = directory / EVENTS_FILE
        self.servers_path = directory / SERVERS_FILE
        self.last_id = max(map(_id, read_events(self.events_path)), default=0)
        self.addresses = {seen.id: seen.address for seen in read_servers(self.servers_path)}

    def poll(self) -> None:
        """Ask the API once and append what is new; :class:`ProcessError` when it fails."""
        events = self.api.events_after(self.last_id)
        servers = [
            seen
            for seen in self.api.servers()
            if seen.address and self.addresses.get(seen.id) != seen.address
        ]
        _append(self.events_path, (_document(event) for event in events))
        _append(self.servers_path, (asdict(seen) for seen in servers))
        if events:
            self.last_id = _id(events[-1])
        self.addresses.update((seen.id, seen.address) for seen in servers)


def read_events(path: Path) -> list[Event]:
    """The events of an ``events.jsonl``, oldest first (empty when there is none)."""
    return [event_of(document) for document in _lines(path)]


def read_servers(path: Path) -> list[ServerSeen]:
    """The servers of a ``servers.jsonl`` in the order seen (empty when there is none)."""
    return [
        ServerSeen(
            id=str(document["id"]),
            pool=str(document["pool"]),
            address=str(document["address"]),
            created_at=float(document["created_at"]),
        )
        for document in _lines(path)
    ]


def _lines(path: Path) -> Iterator[dict[str, Any]]:
    try:
        handle = open(path)  # noqa: SIM115 (closed below; a missing file is no history)
    except FileNotFoundError:
        return
    with handle:
        for line in handle:
            try:
                document = json.loads(line)
            except ValueError:
                return  # cut short: the lab was killed mid-line
            if isinstance(document, dict):
                yield document


def _append(path: Path, documents: Iterator[dict[str, Any]]) -> None:
    lines = "".join(json.dumps(document, separators=(",", ":")) + "\n" for document in documents)
    if lines:
        with open(path, "a") as handle:
            handle.write(lines)


def _document(event: Event) -> dict[str, Any]:
    document = asdict(event)
    for key in ("from_state", "to_state"):
        state = document[key]
        document[key] = state.value if state is not None else None
    return document


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def _state(value: object) -> ServerState | None:
    if value is None:
        return None
    try:
        return ServerState(str(value))
    except ValueError:
        return None  # a state a newer manager knows: the event still counts
