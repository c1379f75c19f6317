"""PowerDNS with the dnslb pipe backend: its configuration, and running it as a child process.

:func:`render_config` writes the ``pdns.conf`` that this product needs, each setting with the
reason for it (measured on pdns 4.7.3, see ``docs/pdns.md``). :class:`PdnsServer` runs
``pdns_server`` in a process group of its own, waits until it answers, and stops it with its
coprocesses. The lab and the integration tests use both.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from daemons.process import log_tail, spawn, stop_group
from dnslb.errors import ConfigError, ProcessError
from dnslb.resp import redact_url, url_has_password


def pipe_command(
    plan: str | os.PathLike[str],
    *,
    python: str | None = None,
    redis_password_file: str | os.PathLike[str] | None = None,
    state_dir: str | os.PathLike[str] | None = None,
    explain: bool = False,
) -> list[str]:
    """The coprocess command line PowerDNS should run for a plan location.

    ``explain`` turns on the debug TXT answers at ``_dnslb-explain.<pool>``
    (:mod:`pipe_backend.explain`).

    ``state_dir`` is the pipe backend's ``--state-dir`` (an absolute path; where it keeps its
    last good plan): without it the pipe backend picks its default, ``$STATE_DIRECTORY`` or the
    pdns user's ``~/.local/state/dnslb/pipe-backend``.

    PowerDNS splits ``pipe-command`` on spaces and execs it, so the interpreter path must be
    absolute and no part may hold a space (nor any other blank or control character: a newline
    would start a line of its own in ``pdns.conf``). Anyone on the host can read a command line
    (``ps``), so a Redis password is passed by reference: ``redis_password_file`` names a file
    holding it (else the pipe backend reads ``DNSLB_REDIS_PASSWORD`` from pdns_server's
    environment), and a password in a ``redis://`` URL is refused.
    """
    plan_text = str(plan)
    if plan_text.startswith("redis://") and url_has_password(plan_text):
        raise ConfigError(
            "pipe-command",
            [
                f"{redact_url(plan_text)}: a password in the plan URL would be on pdns's "
                "pipe-command, which anyone on the host can read with ps; remove it from the "
                "URL and give its file instead (dnslb pdns-config --redis-password-file FILE, "
                "readable by the pdns user only), or set DNSLB_REDIS_PASSWORD in pdns_server's "
                "environment"
            ],
        )
    # -P: never put pdns's working directory on sys.path, where a stray module could shadow ours.
    command = [python or sys.executable, "-P", "-m", "pipe_backend", "--plan", plan_text]
    if redis_password_file is not None:
        password_file = str(redis_password_file)
        if not plan_text.startswith("redis://"):
            raise ConfigError(
                "pipe-command", [f"{password_file}: a password file is for a redis:// plan only"]
            )
        if not os.path.isabs(password_file):
            raise ConfigError("pipe-command", [f"{password_file!r}: must be an absolute path"])
        command += ["--redis-password-file", password_file]
    if state_dir is not None:
        if not os.path.isabs(state_dir):
            raise ConfigError("pipe-command", [f"{str(state_dir)!r}: must be an absolute path"])
        command += ["--state-dir", str(state_dir)]
    if explain:
        command.append("--explain")
    unsafe = [part for part in command if not part.isprintable() or any(c.isspace() for c in part)]
    if unsafe:
        raise ConfigError(
            "pipe-command",
            [
                f"{redact_url(part)!r}: PowerDNS splits pipe-command on spaces "
                "(and a line break or control character has no place in pdns.conf)"
                for part in unsafe
            ],
        )
    if not os.path.isabs(command[0]):
        raise ConfigError("pipe-command", [f"{command[0]!r}: must be an absolute path"])
    return command


@dataclass(frozen=True, slots=True)
class PdnsSettings:
    """What varies between PowerDNS instances of this product."""

    plan: str
    address: str = "127.0.0.1"
    port: int = 53
    threads: int = 2  # distributor threads: one pipe coprocess each
    abi: int = 5
    pipe_timeout_ms: int = 2000
    # negquery-cache-ttl: how long pdns remembers an empty answer. A pool with no member to
    # answer (all launching, say) is empty for a moment; clients must see it filled soon.
    negative_ttl: int = 5
    python: str | None = None
    # A file holding the Redis password of a redis:// plan: the pipe backend reads it (a
    # password on pipe-command would be visible to anyone on the host with ps).
    redis_password_file: str | None = None
    # The pipe backend's --state-dir, writable by the pdns user (None: its own default).
    state_dir: str | None = None
    # The pipe backend's --explain: TXT at _dnslb-explain.<pool> (a debugging aid; off).
    explain: bool = False
    # DNSSEC: the gsqlite3 database holding the zones' keys (an absolute path; None: unsigned).
    # pdns signs the pipe backend's answers live with them (docs/pdns.md#dnssec).
    dnssec_database: str | None = None
    # max-signature-cache-entries, with DNSSEC: pdns keeps every signature it made (unbounded by
    # default) and clears them all at this many. A pool has a few answer sets, but each fresh
    # NXDOMAIN name adds a narrow NSEC3 signature: a random-name flood would grow it for a week.
    signature_cache_entries: int = 100_000


def render_config(settings: PdnsSettings, socket_dir: str | os.PathLike[str]) -> str:
    """The ``pdns.conf`` text for ``settings``, with the reason for each setting."""
    command = " ".join(
        pipe_command(
            settings.plan,
            python=settings.python,
            redis_password_file=settings.redis_password_file,
            state_dir=settings.state_dir,
            explain=settings.explain,
        )
    )
    return f"""\
# PowerDNS authoritative server with the dnslb pipe backend (generated by dnslb).
# Each setting says why; the figures were measured on pdns 4.7.3 (docs/pdns.md).
{launch_settings(settings)}
# An absolute executable path: pdns splits this on spaces and execs it (no shell).
pipe-command={command}
# ABI 3+ lets load-balanced answers carry non-zero scope bits, which pdns 4.7 never caches:
# they rotate per query while SOA, NS and negative answers stay in pdns's caches.
# ABI 5 adds CMD, for `pdnsutil backend-cmd pipe status`.
pipe-abi-version={settings.abi}
# Pass the EDNS Client Subnet to the pipe backend (ABI 3+: its Q lines' last field) and return
# the answer's scope: pools with client networks answer by the client's location
# (docs/topology.md); without the option the resolver's address decides.
edns-subnet-processing=yes
# A reply slower than this drops the query and restarts the coprocess; ours take microseconds.
pipe-timeout={settings.pipe_timeout_ms}
# Required with a pipe backend: pdns 4.7 exits at startup when it tries to list zones.
zone-cache-refresh-interval=0
# consistent-backends=yes asks ANY twice per query; no halves the pipe round trips.
consistent-backends=no
# pdns shuffles answer records by default, which would undo the weighted order of addresses
# (most clients connect to the first one).
no-shuffle=yes
# One coprocess per distributor thread.
distributor-threads={settings.threads}
# How long an empty answer stays in pdns's query cache: a pool that was empty for a moment
# (every server still booting) must be answered as soon as it has members.
negquery-cache-ttl={settings.negative_ttl}
{process_settings(settings, socket_dir)}"""


def launch_settings(settings: PdnsSettings) -> str:
    """The ``launch`` line, and with DNSSEC the key database's backend after the pipe."""
    if settings.dnssec_database is None:
        return "launch=pipe"
    database = settings.dnssec_database
    if not os.path.isabs(database) or not database.isprintable() or "\n" in database:
        raise ConfigError("dnssec", [f"{database!r}: must be an absolute path on one line"])
    return f"""\
# DNSSEC: the pipe backend answers every name; gsqlite3 holds only the zones' keys and
# metadata (a domains row per signed zone, made by `dnslb pdns-dnssec-setup`). pdns signs
# whatever the pipe answers as it builds each packet, and proves denials with narrow NSEC3,
# made on the fly: the pipe backend cannot answer the ordered-name lookups plain NSEC needs.
launch=pipe,gsqlite3
gsqlite3-database={database}
gsqlite3-dnssec=yes
# pdns keeps every signature it made until the week ends, unbounded by default; each fresh
# NXDOMAIN name adds one (its narrow NSEC3), so a random-name flood would grow it without end.
# At this many it is cleared whole: the pools' few answer sets are then signed again, once each.
max-signature-cache-entries={settings.signature_cache_entries}"""


def process_settings(settings: PdnsSettings, socket_dir: str | os.PathLike[str]) -> str:
    """The settings of how pdns_server runs as a child process here: where it listens, in the
    foreground, logging to its standard error. Any backend's configuration ends with them."""
    return f"""\
local-address={settings.address}
local-port={settings.port}
socket-dir={socket_dir}
guardian=no
daemon=no
disable-syslog=yes
write-pid=no
log-timestamp=no
loglevel=4
"""


def find_pdns_server() -> str:
    """The path of ``pdns_server``; a :class:`ProcessError` says how to install it."""
    for candidate in (shutil.which("pdns_server"), "/usr/sbin/pdns_server"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise ProcessError(
        "pdns_server not found: install PowerDNS (apt-get install pdns-server pdns-backend-pipe)"
    )


class PdnsServer:
    """A ``pdns_server`` child process serving a plan through the pipe backend.

    ``config`` replaces the rendered ``pdns.conf`` (a benchmark's other backend or cache
    settings); it must listen on ``settings.address`` and ``settings.port``, which :meth:`start`
    probes, and should put its ``socket-dir`` in ``workdir``. The rendered one gives the pipe
    backend ``workdir/pipe-backend`` as its state directory unless ``settings.state_dir`` says.
    """

    def __init__(
        self,
        settings: PdnsSettings,
        workdir: str | os.PathLike[str],
        *,
        config: str | None = None,
    ) -> None:
        self.settings = settings
        self.workdir = Path(workdir)
        self.config = config
        self.log_path = self.workdir / "pdns.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, *, probe_name: str, timeout: float = 15.0) -> None:
        """Start pdns_server and wait until it answers an SOA query for ``probe_name``."""
        binary = find_pdns_server()
        self.workdir.mkdir(parents=True, exist_ok=True)
        settings = self.settings
        if settings.state_dir is None:
            state_dir = (self.workdir / "pipe-backend").resolve()
            settings = dataclasses.replace(settings, state_dir=str(state_dir))
        config = self.config if self.config is not None else render_config(settings, self.workdir)
        (self.workdir / "pdns.conf").write_text(config)
        self.process = spawn(
            [binary, f"--config-dir={self.workdir}"],
            name="pdns_server",
            ready=lambda _: soa_answers(self.settings.address, self.settings.port, probe_name),
            log=self.log_path,
            timeout=timeout,
            describe_log=self.log_tail,
        )

    def log_tail(self, lines: int = 20) -> str:
        """The end of pdns_server's log (its coprocesses' lines too)."""
        return log_tail(self.log_path, lines) or "(pdns_server wrote nothing)"

    def stop(self, timeout: float = 5.0) -> None:
        """Stop pdns_server and its coprocesses (the whole process group)."""
        process, self.process = self.process, None
        if process is not None:
            stop_group(process, timeout=timeout)

    def __enter__(self) -> PdnsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def soa_answers(address: str, port: int, name: str, timeout: float = 0.3) -> bool:
    """True when the server at ``address:port`` answers an SOA query for ``name`` with NOERROR.

    A minimal hand-built query, so that this check needs no DNS library.
    """
    query_id = os.getpid() & 0xFFFF
    header = struct.pack("!HHHHHH", query_id, 0, 1, 0, 0, 0)
    qname = b"".join(
        bytes([len(label)]) + label.encode("ascii") for label in name.split(".") if label
    )
    packet = header + qname + b"\0" + struct.pack("!HH", 6, 1)
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.sendto(packet, (address, port))
            reply = sock.recv(4096)
        except OSError:
            return False
    if len(reply) < 12:
        return False
    reply_id, flags, _, answers = struct.unpack("!HHHH", reply[:8])
    return bool(reply_id == query_id and flags & 0x8000 and flags & 0xF == 0 and answers > 0)
