"""The nginx configuration a cache server gets (the real nginx runs it in tests/integration)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from daemons.nginx import NginxSettings, render_config
from dnslb.errors import ConfigError


def test_every_path_is_under_the_work_dir(tmp_path: Path) -> None:
    text = render_config(NginxSettings(origin="http://127.0.0.1:9000"), tmp_path)
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        words = line.strip().rstrip(";").split()
        paths = [w for w in words if w.startswith("/") and w not in ("/", "/nginx_status")]
        assert all(Path(p).is_relative_to(tmp_path.resolve()) for p in paths), line
    assert "daemon off;" in text and "master_process on;" in text
    assert f"pid {tmp_path.resolve()}/nginx.pid;" in text


@pytest.mark.parametrize(
    ("origin", "proxy_pass", "host"),
    [
        ("http://127.0.0.1:9000", "proxy_pass http://dnslb_origin;", "127.0.0.1:9000"),
        ("http://127.0.0.1:9000/", "proxy_pass http://dnslb_origin;", "127.0.0.1:9000"),
        ("http://origin.test/base", "proxy_pass http://dnslb_origin/base/;", "origin.test"),
        ("https://origin.test:8443/b/", "proxy_pass https://dnslb_origin/b/;", "origin.test:8443"),
    ],
    ids=["bare", "slash", "path", "https-path"],
)
def test_the_origin_is_proxied_with_its_host(origin: str, proxy_pass: str, host: str) -> None:
    text = render_config(NginxSettings(origin=origin), "/w")
    assert proxy_pass in text
    assert f"proxy_set_header Host {host};" in text
    assert f"server {host};" in text
    assert ("proxy_ssl_name origin.test;" in text) == origin.startswith("https")


def test_without_an_origin_there_is_no_cache(tmp_path: Path) -> None:
    text = render_config(NginxSettings(), tmp_path)
    assert "proxy_cache" not in text and "upstream" not in text
    assert "return 404;" in text
    assert "location = /nginx_status" in text


def test_the_user_line_appears_only_for_root(monkeypatch) -> None:
    text = render_config(NginxSettings(user="www-data www-data"), "/w")
    assert ("user www-data www-data;" in text) == (os.geteuid() == 0)


def test_bad_settings_are_all_reported() -> None:
    settings = NginxSettings(
        port=0,
        status_path="status; evil",
        origin="ftp://x",
        worker_connections=0,
    )
    with pytest.raises(ConfigError) as caught:
        render_config(settings, "/w")
    assert [p.split(":")[0] for p in caught.value.problems] == [
        "port",  # the fields' bounds, in their order
        "worker_connections",
        "status_path",  # then the rules across fields
        "origin",
    ]


@pytest.mark.parametrize(
    "origin", ["http://o/x?y=1", "http://o/a b", "http://o/;rm", "//o"], ids=str
)
def test_an_origin_that_would_break_the_config_is_refused(origin: str) -> None:
    with pytest.raises(ConfigError, match="origin"):
        render_config(NginxSettings(origin=origin), "/w")


def test_capacity_emulation_paces_small_writes_and_keeps_delays_out_of_the_log() -> None:
    settings = NginxSettings(
        origin="http://127.0.0.1:9000", capacity_rps=20, send_rate=40000, send_chunk=4096
    )
    text = render_config(settings, "/w")
    assert "rate=1200r/m;" in text
    assert "limit_req_log_level warn;" in text
    assert "limit_rate 40000;" in text
    assert "output_buffers 1 4096;" in text and "sendfile off;" in text


def test_without_capacity_emulation_there_is_no_pacing() -> None:
    text = render_config(NginxSettings(origin="http://127.0.0.1:9000"), "/w")
    assert "limit_req" not in text and "limit_rate" not in text and "output_buffers" not in text


def test_a_send_chunk_out_of_range_is_refused() -> None:
    with pytest.raises(ConfigError, match="send_chunk"):
        render_config(NginxSettings(send_rate=1000, send_chunk=100), "/w")
