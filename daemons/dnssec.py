"""DNSSEC for the pipe backend's zones: the keys in a gsqlite3 database beside it.

PowerDNS signs answers as it builds each packet, whichever backend produced the records, with
the keys another backend holds (``launch=pipe,gsqlite3``, ``gsqlite3-dnssec=yes``; rendered by
``dnslb pdns-config --dnssec DATABASE``). :func:`secure_zone` makes a zone signed: the
database's schema, the zone's ``domains`` row, a key (``pdnsutil secure-zone``), narrow NSEC3
(``pdnsutil set-nsec3 ZONE '1 0 0 -' narrow``: the pipe backend cannot answer the ordered-name
lookups that NSEC and stored NSEC3 chains need, narrow NSEC3 proofs are made from an ANY
lookup), and returns the DS records to hand to the parent zone. It is safe to run again: an
existing key is kept. See ``docs/pdns.md#dnssec``.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
from contextlib import closing
from pathlib import Path

from dnslb.errors import ConfigError, ProcessError

SCHEMA = Path("/usr/share/pdns-backend-sqlite3/schema/schema.sqlite3.sql")
"""Debian's gsqlite3 schema (package pdns-backend-sqlite3)."""

NSEC3_PARAMETERS = "1 0 0 -"
"""SHA-1, no opt-out, no extra iterations, no salt (RFC 9276's advice)."""


def config_value(config_dir: str | os.PathLike[str], key: str) -> str | None:
    """The value of ``key`` in ``config_dir/pdns.conf`` (the last one set), None when unset."""
    path = Path(config_dir) / "pdns.conf"
    try:
        text = path.read_text()
    except OSError as error:
        raise ConfigError(str(path), [f"cannot read: {error.strerror}"]) from None
    value = None
    for line in text.splitlines():
        name, equals, rest = line.strip().partition("=")
        if equals and name.strip() == key:
            value = rest.strip()
    return value


def key_database(config_dir: str | os.PathLike[str]) -> Path:
    """The gsqlite3 database of ``config_dir/pdns.conf``, which must launch gsqlite3 with
    ``gsqlite3-dnssec=yes``."""
    where = str(Path(config_dir) / "pdns.conf")
    database = config_value(config_dir, "gsqlite3-database")
    if database is None or config_value(config_dir, "gsqlite3-dnssec") != "yes":
        raise ConfigError(
            where,
            [
                "no gsqlite3 key database with gsqlite3-dnssec=yes: render the configuration "
                "with dnslb pdns-config --dnssec DATABASE"
            ],
        )
    return Path(database)


def pipe_serves_zone(config_dir: str | os.PathLike[str], zone: str) -> bool:
    """True when the pipe backend of ``config_dir/pdns.conf`` answers an SOA for ``zone``.

    It runs the configured ``pipe-command`` and asks it, as pdns would: pdnsutil would secure
    a zone that only the key database knows (nobody serves it), and print a DS all the same.
    """
    where = str(Path(config_dir) / "pdns.conf")
    command = config_value(config_dir, "pipe-command")
    if command is None:
        raise ConfigError(where, ["no pipe-command: render it with dnslb pdns-config"])
    abi = int(config_value(config_dir, "pipe-abi-version") or "1")
    fields = ["Q", zone, "IN", "SOA", "-1", "127.0.0.1", "127.0.0.1", "0.0.0.0/0"]
    question = "\t".join(fields[: 6 if abi == 1 else 7 if abi == 2 else 8])
    try:
        result = subprocess.run(
            command.split(),
            input=f"HELO\t{abi}\n{question}\n",
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ProcessError(f"pipe-command {command}: {error}") from None
    return any(
        line.startswith("DATA\t") and "\tSOA\t" in line for line in result.stdout.splitlines()
    )


def prepare_database(database: Path, zone: str, schema: Path = SCHEMA) -> None:
    """Create the gsqlite3 schema in ``database`` when it has none, and ``zone``'s ``domains``
    row when missing (pdnsutil keeps a zone's keys only for a zone a backend lists)."""
    with closing(sqlite3.connect(database)) as connection, connection:
        tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master")}
        if "domains" not in tables:
            try:
                connection.executescript(schema.read_text())
            except OSError as error:
                raise ConfigError(
                    str(schema),
                    [
                        f"gsqlite3 schema not readable ({error.strerror}): install "
                        "pdns-backend-sqlite3"
                    ],
                ) from None
        known = connection.execute("SELECT 1 FROM domains WHERE name = ?", (zone,)).fetchone()
        if known is None:
            connection.execute("INSERT INTO domains (name, type) VALUES (?, 'NATIVE')", (zone,))


def has_keys(database: Path, zone: str) -> bool:
    """True when ``zone`` has at least one key in ``database``."""
    with closing(sqlite3.connect(database)) as connection:
        row = connection.execute(
            "SELECT count(*) FROM cryptokeys JOIN domains ON domains.id = cryptokeys.domain_id "
            "WHERE domains.name = ?",
            (zone,),
        ).fetchone()
    return bool(row and row[0])


def pdnsutil(config_dir: str | os.PathLike[str], *arguments: str) -> str:
    """Run ``pdnsutil --config-dir=DIR ARGUMENTS`` and return its standard output.

    pdnsutil starts the pipe backend's coprocess too (their log lines go to its standard error).
    """
    binary = shutil.which("pdnsutil") or "/usr/bin/pdnsutil"
    command = [binary, f"--config-dir={config_dir}", *arguments]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    except OSError as error:
        raise ProcessError(f"pdnsutil: {error.strerror} (apt-get install pdns-server)") from None
    if result.returncode != 0:
        said = (result.stderr.strip() or result.stdout.strip()).splitlines()[-5:]
        raise ProcessError(
            f"pdnsutil {' '.join(arguments)} exited with status {result.returncode}: "
            + " / ".join(said)
        )
    return result.stdout


def secure_zone(
    config_dir: str | os.PathLike[str], zone: str, *, schema: Path = SCHEMA
) -> list[str]:
    """Sign ``zone`` (a zone of the plan that ``config_dir/pdns.conf``'s pipe backend serves)
    and return its DS records, as ``pdnsutil export-zone-ds`` prints them.

    Keys are made only when the zone has none (a new key would need a new DS at the parent);
    the NSEC3 parameters are set every time. pdns_server caches keys and metadata for up to a
    minute (``domain-metadata-cache-ttl``): restart it, or wait, after securing a zone it serves.
    """
    name = zone.rstrip(".").lower()
    if not name:
        raise ConfigError("zone", ["the root zone is not served by the pipe backend"])
    database = key_database(config_dir)
    if not pipe_serves_zone(config_dir, name):
        raise ConfigError(
            str(Path(config_dir) / "pdns.conf"),
            [f"{name}: not a zone of the plan its pipe backend serves (no SOA): nothing to sign"],
        )
    prepare_database(database, name, schema)
    if not has_keys(database, name):
        pdnsutil(config_dir, "secure-zone", name)
    pdnsutil(config_dir, "set-nsec3", name, NSEC3_PARAMETERS, "narrow")
    exported = pdnsutil(config_dir, "export-zone-ds", name)
    return [line.split(" ;", 1)[0] for line in exported.splitlines() if " IN DS " in line]
