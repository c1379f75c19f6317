"""nginx as a cache server: its configuration, and running it as a child process.

:func:`render_config` writes an ``nginx.conf`` for one cache server of a pool: it listens on one
address and port, proxies to an origin with a disk cache (when it has an origin), and serves
``stub_status`` to loopback clients, which is where the agent reads the requests in progress.
Every file nginx writes (pid, logs, temp files, cache) is under the server's work directory.
:class:`NginxServer` runs ``nginx`` in a process group of its own, waits until its status page
answers, and stops it with its workers. The local provider, the lab, the agent's tests and the
benchmarks use both.

What ``stub_status`` counts (nginx 1.22, see ``docs/agent.md``): ``Reading`` + ``Writing`` are
the requests nginx is working on, from the end of the request header to the last byte sent,
including the time spent waiting for the origin, summed over all workers; the status request
itself is one of them. ``requests`` counts every request *started* since the master started,
status requests included.
"""

from __future__ import annotations

import grp
import http.client
import os
import pwd
import shutil
import signal
import subprocess
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from daemons.process import log_tail, spawn, stop_group
from dnslb.config import checked, setting
from dnslb.errors import ProcessError

DEFAULT_STATUS_PATH = "/nginx_status"
CACHE_ZONE = "dnslb_cache"
ORIGIN_UPSTREAM = "dnslb_origin"


@dataclass(frozen=True, slots=True)
class NginxSettings:
    """What varies between cache servers.

    ``origin`` is the URL requests are proxied to (``http://host:port``, optionally with a path
    prefix); None makes a server that only serves its status page (and 404 elsewhere).
    ``user`` is the user the workers run as when nginx starts as root; None means the user
    starting it, so that workers can write the cache under a private work directory. Built in
    code; :func:`render_config` checks it (:func:`~dnslb.config.checked`).
    """

    address: str = setting("127.0.0.1", help="listen address")
    port: int = setting(8080, help="listen port", min=1, max=65535)
    status_path: str = setting(
        DEFAULT_STATUS_PATH, help="where stub_status answers (loopback clients only)"
    )
    origin: str | None = setting(
        None, help="the origin proxied to, http(s)://host:port[/prefix] (null: status page only)"
    )
    worker_processes: int = setting(1, help="nginx worker processes", min=1)
    worker_connections: int = setting(1024, help="connections per worker", min=1)
    cache_max_size_mb: int = setting(256, help="disk cache size in MiB", min=1)
    cache_valid_seconds: int = setting(
        60, help="how long a 200/301/302 stays fresh without cache headers", min=1
    )
    origin_timeout_seconds: int = setting(
        60, help="proxy_read_timeout: the slowest origin answer accepted", min=1
    )
    access_log: bool = setting(
        False, help="one line per request (off by default: a loaded lab fills disks)"
    )
    user: str | None = setting(
        None, help="user (and group) of the workers when nginx starts as root (null: the starter)"
    )
    # Capacity emulation (the lab): at most ``capacity_rps`` requests a second start; the rest
    # wait in a queue of up to ``queue_limit`` (then 503), and each response is sent at
    # ``send_rate`` bytes a second, so a request takes time and a loaded server queues.
    # nginx paces a response per write: after each write it waits written / send_rate. With its
    # default 32 KiB buffers the first ``send_rate`` bytes leave at once and the rest in whole
    # seconds; writes of ``send_chunk`` bytes make a response of S bytes take about
    # (S - send_chunk) / send_rate seconds, as a server's work grows with what it serves
    # (measured in docs/lab.md).
    capacity_rps: float | None = setting(
        None, help="emulated capacity: requests a second, 1/60 to 100000 (null: no limit)"
    )
    queue_limit: int = setting(
        10000, help="requests waiting beyond capacity_rps before a 503", min=0
    )
    send_rate: int | None = setting(
        None, help="emulated bandwidth: bytes a second per response (null: no limit)", min=1
    )
    send_chunk: int = setting(2048, help="bytes per paced write", min=512, max=1048576)

    def config_problems(self) -> Iterator[str]:
        if not self.status_path.startswith("/") or any(c in self.status_path for c in " ;{}"):
            yield f"status_path: must be a plain absolute path, not {self.status_path!r}"
        if self.origin is not None:
            parsed = urllib.parse.urlsplit(self.origin)
            if parsed.scheme not in ("http", "https") or not parsed.netloc:
                yield f"origin: must be an http(s) URL, not {self.origin!r}"
            elif parsed.query or parsed.fragment:
                yield f"origin: must not have a query or fragment: {self.origin!r}"
            elif any(c in self.origin for c in " ;{}'\""):
                yield f"origin: must not contain spaces, quotes or ;{{}}: {self.origin!r}"
        if self.capacity_rps is not None and not 1 / 60 <= self.capacity_rps <= 100000:
            yield f"capacity_rps: must be 1/60 to 100000, not {self.capacity_rps}"

    @property
    def status_url(self) -> str:
        """Where the status page answers (the agent's nginx source reads it)."""
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}{self.status_path}"


def _worker_user(settings: NginxSettings) -> str | None:
    """The ``user`` directive's argument, or None when nginx does not run as root.

    nginx switches its workers to ``nobody`` by default when started as root, and ``nobody``
    cannot write a cache under a work directory that only root can enter (pytest's, a lab's).
    """
    if os.geteuid() != 0:
        return None
    if settings.user is not None:
        return settings.user
    return f"{pwd.getpwuid(os.geteuid()).pw_name} {grp.getgrgid(os.getegid()).gr_name}"


def render_config(settings: NginxSettings, workdir: str | os.PathLike[str]) -> str:
    """The ``nginx.conf`` text for ``settings`` with every path under ``workdir``.

    Raises :class:`~dnslb.errors.ConfigError` listing every problem of ``settings``.
    """
    checked(settings, "nginx settings")
    work = Path(workdir).resolve()
    user = _worker_user(settings)
    user_line = f"user {user};\n" if user else ""
    host = f"[{settings.address}]" if ":" in settings.address else settings.address
    access_log = f"access_log {work}/access.log;" if settings.access_log else "access_log off;"
    cache = upstream = limits = zone = ""
    if settings.capacity_rps is not None:
        # nginx takes whole requests per minute; a queue (burst) without nodelay delays.
        per_minute = max(1, round(settings.capacity_rps * 60))
        # Delays are logged one level below limit_req_log_level: at "warn" they stay out of
        # the error log, which would otherwise get a line per queued request.
        zone = (
            f"    limit_req_zone $server_addr zone=dnslb_capacity:1m rate={per_minute}r/m;\n"
            "    limit_req_status 503;\n"
            "    limit_req_log_level warn;\n\n"
        )
        limits += f"            limit_req zone=dnslb_capacity burst={settings.queue_limit};\n"
    if settings.send_rate is not None:
        limits += (
            f"            limit_rate {settings.send_rate};\n"
            f"            sendfile off;\n"
            f"            output_buffers 1 {settings.send_chunk};\n"
        )
    if settings.origin is None:
        content = "        location / {\n            return 404;\n        }\n"
    else:
        origin = urllib.parse.urlsplit(settings.origin)
        # An upstream block, so that connections to the origin are kept alive and reused.
        upstream = (
            f"    upstream {ORIGIN_UPSTREAM} {{\n"
            f"        server {origin.netloc};\n"
            f"        keepalive 32;\n"
            f"    }}\n\n"
        )
        # (A cache zone starts a cache manager and a cache loader process: only with an origin.)
        cache = (
            f"    proxy_cache_path {work}/cache levels=1:2 keys_zone={CACHE_ZONE}:10m\n"
            f"                     max_size={settings.cache_max_size_mb}m inactive=10m"
            " use_temp_path=off;\n\n"
        )
        # With a path, nginx puts it in place of the location's "/": "/a" must map to
        # "/base/a", not "/basea". Without one, the request URI goes through unchanged.
        path = origin.path.rstrip("/") + "/" if origin.path not in ("", "/") else ""
        tls = ""
        if origin.scheme == "https":  # the upstream's name is ours; SNI needs the origin's
            indent = " " * 12
            tls = f"{indent}proxy_ssl_server_name on;\n{indent}proxy_ssl_name {origin.hostname};\n"
        content = f"""\
        location / {{
{limits}            proxy_pass {origin.scheme}://{ORIGIN_UPSTREAM}{path};
            proxy_set_header Host {origin.netloc};
{tls}            # Keep-alive to the origin needs HTTP/1.1 and no "Connection: close" from us.
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_read_timeout {settings.origin_timeout_seconds}s;
            proxy_cache {CACHE_ZONE};
            # One origin per server, so the URI with its query is the whole identity.
            proxy_cache_key $request_uri;
            proxy_cache_valid 200 301 302 {settings.cache_valid_seconds}s;
            add_header X-Cache-Status $upstream_cache_status always;
        }}
"""
    return f"""\
# nginx cache server (generated by dnslb). Everything it writes is under {work}.
# In the foreground so that its manager sees it exit; a master process so that workers restart.
daemon off;
master_process on;
{user_line}worker_processes {settings.worker_processes};
# A proxied request holds two descriptors (client and origin).
worker_rlimit_nofile {2 * settings.worker_connections + 64};
pid {work}/nginx.pid;
lock_file {work}/nginx.lock;
error_log {work}/error.log warn;

events {{
    worker_connections {settings.worker_connections};
}}

http {{
    {access_log}
    # The compiled-in temp paths are under /var/lib/nginx: keep every write in the work dir.
    client_body_temp_path {work}/temp/body;
    proxy_temp_path {work}/temp/proxy;
    fastcgi_temp_path {work}/temp/fastcgi;
    uwsgi_temp_path {work}/temp/uwsgi;
    scgi_temp_path {work}/temp/scgi;
{zone}{cache}{upstream}    server {{
        listen {host}:{settings.port};

        # The agent reads requests in progress here; nobody else may.
        location = {settings.status_path} {{
            stub_status;
            allow 127.0.0.0/8;
            allow ::1;
            deny all;
            access_log off;
        }}

{content}    }}
}}
"""


def find_nginx() -> str:
    """The path of ``nginx``; a :class:`ProcessError` says how to install it."""
    for candidate in (shutil.which("nginx"), "/usr/sbin/nginx"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise ProcessError("nginx not found: install it (apt-get install nginx-light)")


def status_answers(settings: NginxSettings, timeout: float = 0.5) -> bool:
    """True when the status page at ``settings.status_url`` answers 200 with stub_status text."""
    connection = http.client.HTTPConnection(settings.address, settings.port, timeout=timeout)
    try:
        connection.request("GET", settings.status_path)
        response = connection.getresponse()
        body = response.read()
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()
    return response.status == 200 and body.startswith(b"Active connections:")


class NginxServer:
    """An ``nginx`` child process (master and workers) serving one cache server."""

    def __init__(self, settings: NginxSettings, workdir: str | os.PathLike[str]) -> None:
        self.settings = settings
        self.workdir = Path(workdir)
        self.log_path = self.workdir / "error.log"
        self.stderr_path = self.workdir / "stderr.log"  # copies of startup errors, crashes
        self.pid_path = self.workdir / "nginx.pid"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def status_url(self) -> str:
        return self.settings.status_url

    @property
    def pid(self) -> int | None:
        """The master's pid while it runs."""
        if self.process is None or self.process.poll() is not None:
            return None
        return self.process.pid

    def start(self, timeout: float = 15.0) -> None:
        """Start nginx and wait until its status page answers.

        Raises :class:`ProcessError` with the end of nginx's log when it exits (a port in use,
        a bad origin) or does not answer within ``timeout`` seconds.
        """
        if self.process is not None:
            raise ProcessError("nginx is already running")
        binary = find_nginx()
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "temp").mkdir(exist_ok=True)
        config_path = self.workdir / "nginx.conf"
        config_path.write_text(render_config(self.settings, self.workdir))
        self.pid_path.unlink(missing_ok=True)
        self.process = spawn(
            [
                binary,
                "-p",
                f"{self.workdir.resolve()}/",
                "-c",
                str(config_path.resolve()),
                # Errors before the configuration is read go here too, not to stderr.
                "-e",
                str(self.log_path.resolve()),
            ],
            name="nginx",
            # nginx writes its pid file only once its sockets are bound: before that, a status
            # page on this port could be another server's (ours retries bind() for 2.5 s).
            ready=lambda process: self._pid_written(process.pid) and status_answers(self.settings),
            log=self.stderr_path,
            timeout=timeout,
            describe_log=self.log_tail,
        )

    def _pid_written(self, pid: int) -> bool:
        try:
            return self.pid_path.read_text().strip() == str(pid)
        except OSError:
            return False

    def log_tail(self, lines: int = 20) -> str:
        """The end of nginx's error log (of what it wrote to stderr when the log has nothing)."""
        return (
            log_tail(self.log_path, lines)
            or log_tail(self.stderr_path, lines)
            or "(nginx wrote nothing)"
        )

    def stop(self, timeout: float = 5.0, *, graceful: bool = False) -> None:
        """Stop nginx and wait until its process group is gone: now (open requests are cut),
        or with ``graceful`` as ``nginx -s quit`` does (SIGQUIT: it closes its listening
        sockets and ends the requests in progress), whatever is left cut after ``timeout``."""
        process, self.process = self.process, None
        if process is not None:
            sig = signal.SIGQUIT if graceful else signal.SIGTERM
            stop_group(process, sig=sig, timeout=timeout)

    def __enter__(self) -> NginxServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
