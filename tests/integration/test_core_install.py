"""A DNS host installs ``dnslb`` with no extra: the pipe backend and the core's commands then run
with the standard library alone, and a command that needs an extra says which.

The check is real: a virtual environment of Debian's python3 without any third-party package
(not even pip), with the checkout on its path.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import plan_doc

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("python3") is None, reason="no python3 to make a venv with"),
]


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    venv = tmp_path_factory.mktemp("bare-venv")
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(purelib) / "dnslb-checkout.pth").write_text(f"{ROOT}\n")
    return python


def run(
    python: Path, *args: str, stdin: str = "", cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(python), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        check=False,
    )


def test_the_environment_really_has_no_third_party_package(bare_python: Path):
    for module in ("yaml", "httpx", "fastapi", "psutil"):
        assert run(bare_python, "-c", f"import {module}").returncode != 0, module


def test_the_pipe_backend_answers_with_the_standard_library_alone(
    bare_python: Path, tmp_path: Path
):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(plan_doc()))
    done = run(
        bare_python,
        "-P",
        "-m",
        "pipe_backend",
        "--plan",
        str(plan),
        "--last-good",
        str(tmp_path / "last-good.json"),
        stdin="HELO\t5\nQ\twww.example.test\tIN\tA\t-1\t192.0.2.1\t0.0.0.0\t0.0.0.0/0\n",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("OK")
    assert any(line.startswith("DATA") and "\tA\t" in line for line in lines), lines
    assert lines[-1] == "END"


def test_the_core_commands_run_and_the_others_name_their_extra(bare_python: Path, tmp_path: Path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(plan_doc()))
    checked = run(bare_python, "-m", "cli", "plan", "check", str(plan))
    assert checked.returncode == 0, checked.stderr
    assert "ok, plan v" in checked.stdout
    config = run(bare_python, "-m", "cli", "pdns-config", "--plan", str(plan))
    assert config.returncode == 0, config.stderr
    assert "-m pipe_backend" in config.stdout
    manager = run(bare_python, "-m", "cli", "manager", "--config", str(tmp_path / "none.yaml"))
    assert manager.returncode == 1
    assert "pip install 'dnslb[manager]'" in manager.stderr, manager.stderr
    assert "Traceback" not in manager.stderr
