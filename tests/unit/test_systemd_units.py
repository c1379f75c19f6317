"""The systemd units of ``deploy/systemd/`` stay valid and name only what exists.

``systemd-analyze verify`` reads the units and the pdns drop-in against a copy of this
machine's unit directory (so that ``sysinit.target`` and Debian's ``pdns.service`` are there)
with stand-ins for the programs they run; the rest needs no systemd: every ``ExecStart=`` parses
with the real command line, the hardening each unit promises in docs/deploy.md is there, and the
configurations that page shows load and name only credentials their unit loads.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from agents.node_agent import NodeAgentConfig
from cli.main import build_parser
from dnslb.agent_config import AgentConfig
from dnslb.config import load_config
from manager.config import load_manager_config
from pipe_backend.command import default_state_dir
from tests.tls_support import Pki, make_pki

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "deploy" / "systemd"
DROP_IN = UNITS / "pdns.service.d" / "dnslb.conf"
DEPLOY_DOC = ROOT / "docs" / "deploy.md"
DNSLB = "/opt/dnslb/bin/dnslb"
MANAGER, AGENT, NODE_AGENT = (
    "dnslb-manager.service",
    "dnslb-agent.service",
    "dnslb-node-agent.service",
)
SERVICES = (MANAGER, AGENT, NODE_AGENT)
SYSTEM_UNIT_DIRS = (Path("/usr/lib/systemd/system"), Path("/lib/systemd/system"))

Unit = dict[str, dict[str, list[str]]]
"""A unit file: section -> key -> every value given, in order (systemd keys may repeat)."""


def parse_unit(text: str) -> Unit:
    """The settings of a unit file (comments and blank lines skipped)."""
    unit: Unit = {}
    section: dict[str, list[str]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = unit.setdefault(line[1:-1], {})
            continue
        key, separator, value = line.partition("=")
        assert separator, f"not KEY=VALUE: {raw!r}"
        section.setdefault(key.strip(), []).append(value.strip())
    return unit


def service(name: str) -> dict[str, list[str]]:
    return parse_unit((UNITS / name).read_text())["Service"]


def one(settings: dict[str, list[str]], key: str) -> str:
    [value] = settings[key]
    return value


def exec_program(command_line: str) -> str:
    """The program an ``Exec*=`` line runs (without systemd's ``-@:+!`` prefixes)."""
    return shlex.split(command_line)[0].lstrip("-@:+!")


def test_the_deploy_directory_has_the_units_the_docs_name() -> None:
    names = sorted(path.name for path in UNITS.glob("*.service"))
    assert names == sorted(SERVICES)
    assert DROP_IN.is_file()
    text = DEPLOY_DOC.read_text()
    for name in (*SERVICES, "pdns.service.d/dnslb.conf"):
        assert f"deploy/systemd/{name}" in text


def _system_unit_dir() -> Path | None:
    for directory in SYSTEM_UNIT_DIRS:
        if (directory / "sysinit.target").is_file():
            return directory
    return None


def _stand_in(root: Path, program: str) -> None:
    path = root / program.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)


def test_the_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    system_units = _system_unit_dir()
    if analyze is None or system_units is None:
        pytest.skip("needs systemd-analyze and a systemd unit directory (apt-get install systemd)")
    root = tmp_path / "root"
    vendor = root / "usr" / "lib" / "systemd" / "system"
    shutil.copytree(system_units, vendor, symlinks=True)
    pdns = vendor / "pdns.service"
    if not pdns.is_file():  # no pdns-server here: a stand-in, so that the drop-in is read
        pdns.write_text("[Service]\nExecStart=/usr/sbin/pdns_server --daemon=no\n")
    local = root / "etc" / "systemd" / "system"
    (local / "pdns.service.d").mkdir(parents=True)
    for name in SERVICES:
        shutil.copy(UNITS / name, local / name)
    shutil.copy(DROP_IN, local / "pdns.service.d" / DROP_IN.name)
    for unit in (*(local / name for name in SERVICES), pdns):
        for line in parse_unit(unit.read_text())["Service"].get("ExecStart", []):
            _stand_in(root, exec_program(line))
    result = subprocess.run(
        [
            analyze,
            "verify",
            "--man=no",
            "--generators=no",
            f"--root={root}",
            *(f"/etc/systemd/system/{name}" for name in SERVICES),
            "pdns.service",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # Unknown keys and bad values are only warnings to systemd: any output is a failure here.
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def _help(subcommand: str) -> str:
    return subprocess.run(
        [sys.executable, "-m", "cli", subcommand, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=ROOT,
    ).stdout


@pytest.mark.parametrize("name", SERVICES)
def test_exec_start_is_a_dnslb_command_that_parses(name: str) -> None:
    argv = shlex.split(one(service(name), "ExecStart"))
    assert argv[0] == DNSLB  # the venv of docs/deploy.md
    args = build_parser().parse_args(argv[1:])  # an unknown option or command exits here
    assert args.command == argv[1]
    usage = _help(argv[1])
    for option in (word for word in argv[2:] if word.startswith("--")):
        assert option in usage


COMMON_HARDENING = {
    "NoNewPrivileges": "yes",
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "PrivateTmp": "yes",
    "PrivateDevices": "yes",
    "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes",
    "ProtectKernelLogs": "yes",
    "ProtectControlGroups": "yes",
    "RestrictNamespaces": "yes",
    "RestrictSUIDSGID": "yes",
    "LockPersonality": "yes",
    "MemoryDenyWriteExecute": "yes",
    "SystemCallArchitectures": "native",
    "Restart": "on-failure",
}


@pytest.mark.parametrize(
    ("name", "capabilities", "families"),
    [
        pytest.param(MANAGER, "", "AF_UNIX AF_INET AF_INET6", id="manager"),
        pytest.param(AGENT, "", "AF_UNIX AF_INET AF_INET6 AF_NETLINK", id="agent"),
        pytest.param(
            NODE_AGENT, "CAP_NET_ADMIN", "AF_UNIX AF_INET AF_INET6 AF_NETLINK", id="node-agent"
        ),
    ],
)
def test_each_unit_is_hardened_as_documented(name: str, capabilities: str, families: str) -> None:
    settings = service(name)
    for key, value in COMMON_HARDENING.items():
        assert one(settings, key) == value, key
    assert one(settings, "CapabilityBoundingSet") == capabilities
    assert one(settings, "AmbientCapabilities") == capabilities
    assert one(settings, "RestrictAddressFamilies") == families
    assert settings["SystemCallFilter"] == ["@system-service", "~@privileged @resources"]
    assert one(settings, "SyslogIdentifier") == name.removesuffix(".service")
    assert "ExecReload" not in settings
    assert one(settings, "RestartForceExitStatus") == "SIGHUP"


def test_only_the_node_agent_may_write_sysctls_and_only_net() -> None:
    assert one(service(NODE_AGENT), "ReadWritePaths") == "/proc/sys/net"
    assert "ReadWritePaths" not in service(MANAGER)
    assert "ReadWritePaths" not in service(AGENT)


def test_no_process_reloads_on_sighup() -> None:
    """The units have no ExecReload= because nothing handles SIGHUP; a process that starts to
    must get one (docs/deploy.md, "Reload")."""
    handlers = [
        f"{path.relative_to(ROOT)}:{number}"
        for package in ("agents", "manager", "api", "cli", "pipe_backend", "dnslb")
        for path in sorted((ROOT / package).rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "SIGHUP" in line
    ]
    assert handlers == []


def test_the_pipe_backend_takes_the_drop_ins_state_directory() -> None:
    settings = parse_unit(DROP_IN.read_text())["Service"]
    directory = f"/var/lib/{one(settings, 'StateDirectory')}"
    # systemd sets $STATE_DIRECTORY to it; pdns passes its environment on to the coprocesses.
    assert default_state_dir({"STATE_DIRECTORY": directory}) == Path(directory)


def _credentials(name: str) -> dict[str, str]:
    """The unit's LoadCredential= IDs and their sources."""
    pairs = (value.partition(":") for value in service(name).get("LoadCredential", []))
    return {credential: source for credential, _, source in pairs}


FILE_REFERENCE = re.compile(r"file:(/[^\s\",}]+)")
CREDENTIAL = re.compile(r"/run/credentials/([^/]+)/(.+)")


def _stand_in_for(path: str, unit: str, pki: Pki, directory: Path) -> Path:
    """A file of the test's for a ``file:`` reference of a deploy.md configuration: a real
    certificate or key for the TLS ones, a token of its own for each other credential."""
    if path == "/etc/dnslb/ca.pem":
        return pki.ca
    if path.startswith("/etc/dnslb/") and path.endswith(".pem"):
        return pki.certificate
    credential = CREDENTIAL.fullmatch(path)
    assert credential is not None, f"{path}: neither a credential nor a certificate"
    assert credential[1] == unit, path
    # A file's credential is its ID; every file of a directory's is ID_FILE.
    loaded = _credentials(unit)
    name = credential[2]
    assert name in loaded or name.partition("_")[0] in loaded, f"{unit} does not load {name}"
    if name.endswith(".key"):
        return pki.key
    token = directory / name
    token.write_text(f"a token for {name} of at least sixteen characters\n")
    return token


@pytest.mark.parametrize(
    ("marker", "name", "load"),
    [
        pytest.param("zones:", MANAGER, load_manager_config, id="manager"),
        pytest.param("server_id:", AGENT, lambda path: load_config(path, AgentConfig), id="agent"),
        pytest.param(
            "node_id:", NODE_AGENT, lambda path: load_config(path, NodeAgentConfig), id="node"
        ),
    ],
)
def test_the_deploy_configurations_load_with_their_units_credentials(
    tmp_path: Path, marker: str, name: str, load: Callable[[Path], object]
) -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", DEPLOY_DOC.read_text(), re.DOTALL)
    [example] = [block for block in blocks if marker in block]
    assert CREDENTIAL.search(example)
    pki = make_pki(tmp_path / "pki")
    config = tmp_path / "config.yaml"
    config.write_text(
        FILE_REFERENCE.sub(
            lambda match: f"file:{_stand_in_for(match[1], name, pki, tmp_path)}", example
        )
    )
    load(config)  # a ConfigError names every problem
