"""A throwaway PostgreSQL cluster: ``initdb`` in a new temporary directory, served on a unix
socket only (no TCP port), stopped and removed at the end (:func:`throwaway_cluster`). The
tests' database, and the benchmark's.

PostgreSQL refuses to run as root: run as root, the cluster runs as the ``postgres`` user that
Debian's package creates (``setpriv``), in a directory given to it. Debian keeps ``initdb``
off PATH (``/usr/lib/postgresql/VERSION/bin``): it is looked for there too.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from daemons.process import spawn, stop_group


def postgres_bin() -> Path | None:
    """The directory of ``initdb`` and ``postgres`` (Debian keeps them off PATH), or None."""
    found = shutil.which("initdb")
    if found is not None:
        return Path(os.path.realpath(found)).parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)
    return Path(versions[0]).parent if versions else None


def unavailable_reason() -> str | None:
    """Why no cluster can be started here (None: one can)."""
    if postgres_bin() is None:
        return "initdb is not installed (Debian package postgresql; scripts/install)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no postgres user to run PostgreSQL as"
    return None


@dataclass
class PostgresCluster:
    """One cluster in ``workdir``; :attr:`url` reaches its ``dnslb`` database as ``dnslb``."""

    workdir: Path
    port: int = 5432  # only names the socket file: nothing listens on TCP
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def socket_dir(self) -> Path:
        return self.workdir / "run"

    @property
    def url(self) -> str:
        return f"postgresql://dnslb@/dnslb?host={self.socket_dir}&port={self.port}"

    def _as_owner(self, command: list[str]) -> list[str]:
        if os.geteuid() != 0:
            return command
        return ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", *command]

    def init(self) -> None:
        binary = postgres_bin()
        assert binary is not None
        self.socket_dir.mkdir(parents=True)
        if os.geteuid() == 0:
            owner = pwd.getpwnam("postgres")
            for path in (self.workdir, self.socket_dir):
                os.chown(path, owner.pw_uid, owner.pw_gid)
        subprocess.run(
            self._as_owner(
                [
                    str(binary / "initdb"),
                    "-D",
                    str(self.workdir / "data"),
                    "-U",
                    "dnslb",
                    "--auth=trust",
                    "--no-sync",
                    "-E",
                    "UTF8",
                ]
            ),
            check=True,
            capture_output=True,
        )
        self.start()
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute("CREATE DATABASE dnslb")

    @property
    def admin_url(self) -> str:
        return f"postgresql://dnslb@/postgres?host={self.socket_dir}&port={self.port}"

    def answers(self) -> bool:
        try:
            with psycopg.connect(self.admin_url, connect_timeout=1):
                return True
        except psycopg.Error:
            return False

    def start(self) -> None:
        binary = postgres_bin()
        assert binary is not None
        command = [
            str(binary / "postgres"),
            "-D",
            str(self.workdir / "data"),
            "-k",
            str(self.socket_dir),
            "-p",
            str(self.port),
            "-c",
            "listen_addresses=",
            "-c",
            "fsync=off",
            "-c",
            "max_connections=50",
        ]
        self.process = spawn(
            self._as_owner(command),
            name="postgres",
            ready=lambda _: self.answers(),
            log=self.workdir / "postgres.log",
            timeout=30.0,
        )

    def stop(self) -> None:
        """Stop it (a fast shutdown: clients are disconnected)."""
        if self.process is not None:
            stop_group(self.process, sig=signal.SIGINT, timeout=10.0)
            self.process = None


@contextlib.contextmanager
def throwaway_cluster() -> Iterator[PostgresCluster]:
    """A started cluster in a new temporary directory, stopped and removed at the end. (Not
    pytest's tmp_path: its parents are private to the test's user, and the cluster may run as
    another.) :func:`unavailable_reason` says first whether one can start here."""
    workdir = Path(tempfile.mkdtemp(prefix="dnslb-pg-"))
    cluster = PostgresCluster(workdir)
    try:
        cluster.init()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)
