"""The import contract: which package may import which (docs/architecture.md draws it).

Read from the source with :mod:`ast`, every import anywhere in a module (also those inside
functions, which run later but are dependencies all the same).

- ``dnslb`` is the core: it imports no other package of ours, and nothing outside the standard
  library when it is imported (``yaml`` is read lazily by the config loader).
- ``pipe_backend`` imports only the standard library and the core: it installs with no
  third-party package and starts fast.
- Components import the core and the shared libraries below them, never each other; ``cli`` is
  the composition root, the one package that imports them all. The exception is ``sim``, a
  harness that runs the manager and the pipe backend themselves on a virtual clock.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

ALLOWED: dict[str, set[str]] = {
    "dnslb": set(),
    "pipe_backend": {"dnslb"},
    "daemons": {"dnslb"},
    "evaluation": {"dnslb"},
    "agents": {"dnslb", "daemons"},
    "manager": {"dnslb", "daemons"},
    "api": {"dnslb"},
    # The simulator runs the product itself on a virtual clock (issue 16): the manager and the
    # pipe backend, never copies of their rules.
    "sim": {"dnslb", "evaluation", "manager", "pipe_backend"},
    "lab": {"dnslb", "daemons", "evaluation"},
    "cli": {
        "dnslb",
        "pipe_backend",
        "daemons",
        "evaluation",
        "agents",
        "manager",
        "api",
        "sim",
        "lab",
    },
}
"""Each package of ours, and the packages of ours it may import."""

STDLIB_ONLY = {"pipe_backend"}
"""Packages that may import nothing outside the standard library and the core, anywhere."""

LAZY_THIRD_PARTY = {"dnslb"}
"""Packages that may use a third-party module only inside a function (never at import time)."""


def ours() -> set[str]:
    return {path.parent.name for path in ROOT.glob("*/__init__.py")} - {"tests", "bench"}


def imports(path: Path) -> list[tuple[str, int, bool]]:
    """(module, line, at import time) of every absolute import in ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.extend((alias.name, child.lineno, top) for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                found.append((child.module, child.lineno, top))
            lazy = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            type_only = isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test)
            visit(child, top and not lazy and not type_only)

    visit(tree, True)
    return found


def edges() -> dict[str, dict[str, list[str]]]:
    """package -> imported package of ours -> where ("path:line")."""
    packages = ours()
    graph: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            for module, line, _ in imports(path):
                target = module.split(".")[0]
                if target in packages and target != package:
                    graph[package][target].append(f"{path.relative_to(ROOT)}:{line}")
    return graph


def test_every_package_is_in_the_contract():
    assert ours() == set(ALLOWED), "a new top-level package needs its line in ALLOWED"


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_a_package_imports_only_what_the_contract_allows(package: str):
    graph = edges()
    wrong = {
        target: where for target, where in graph[package].items() if target not in ALLOWED[package]
    }
    assert wrong == {}, f"{package} imports packages it must not: {wrong}"


@pytest.mark.parametrize("package", sorted(STDLIB_ONLY | LAZY_THIRD_PARTY))
def test_the_core_and_the_pipe_backend_need_no_third_party_package(package: str):
    allowed = set(sys.stdlib_module_names) | {"__future__"} | ALLOWED[package] | {package}
    wrong: list[str] = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for module, line, top in imports(path):
            if module.split(".")[0] in allowed:
                continue
            if package in LAZY_THIRD_PARTY and not top and package not in STDLIB_ONLY:
                continue
            wrong.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert wrong == []


def test_the_contract_catches_a_wrong_import(tmp_path: Path):
    # The checker itself: an import inside a function counts, one under TYPE_CHECKING does not.
    module = tmp_path / "m.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "import os\n"
        "if TYPE_CHECKING:\n"
        "    from manager.service import Manager\n"
        "def f():\n"
        "    from agents.agent import main\n"
    )
    found = imports(module)
    assert ("agents.agent", 6, False) in found
    assert ("os", 2, True) in found
    assert ("manager.service", 4, False) in found  # found, but not at import time
