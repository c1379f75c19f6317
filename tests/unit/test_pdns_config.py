"""The pdns.conf that daemons.pdns renders: unsigned by default, signed with a key database."""

from __future__ import annotations

import pytest

from daemons.pdns import PdnsSettings, render_config
from dnslb.errors import ConfigError


def test_unsigned_by_default() -> None:
    text = render_config(PdnsSettings(plan="/p.json"), "/run/pdns")
    assert "\nlaunch=pipe\n" in text
    assert "gsqlite3" not in text
    assert "signature" not in text


def test_dnssec_launches_the_key_database_after_the_pipe() -> None:
    settings = PdnsSettings(plan="/p.json", dnssec_database="/var/lib/dnslb/keys.sqlite3")
    text = render_config(settings, "/run/pdns")
    lines = text.splitlines()
    assert "launch=pipe,gsqlite3" in lines
    assert "gsqlite3-database=/var/lib/dnslb/keys.sqlite3" in lines
    assert "gsqlite3-dnssec=yes" in lines
    assert "max-signature-cache-entries=100000" in lines
    assert not any(line.startswith("launch=") and line != "launch=pipe,gsqlite3" for line in lines)


@pytest.mark.parametrize(
    "database", ["keys.sqlite3", "/a\nlaunch=bind"], ids=["relative", "newline"]
)
def test_a_bad_key_database_path_is_refused(database: str) -> None:
    with pytest.raises(ConfigError, match="absolute path"):
        render_config(PdnsSettings(plan="/p.json", dnssec_database=database), "/run/pdns")
