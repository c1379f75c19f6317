"""Print the requirements of dnslb's extras named as arguments, from pyproject.toml alone.

The images install their dependencies in a layer of their own, before the code is copied in, so
that a change to the code keeps that layer. An extra may name others (``dnslb[agent,manager]``):
they are expanded here.

    python3 requirements.py pyproject.toml lab > requirements.txt
"""

from __future__ import annotations

import re
import sys
import tomllib


def requirements(project: dict[str, object], extras: list[str]) -> list[str]:
    """The build requirements, the core's dependencies and those of ``extras``, expanded."""
    optional = project["optional-dependencies"]
    assert isinstance(optional, dict)
    out: list[str] = []
    seen: set[str] = set()
    todo = list(extras)
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for requirement in optional[extra]:
            own = re.fullmatch(r"dnslb\[([\w,-]+)\]", requirement)
            if own:
                todo += own.group(1).split(",")
            elif requirement not in out:
                out.append(requirement)
    dependencies = project["dependencies"]
    assert isinstance(dependencies, list)
    return [*dependencies, *out]


def main() -> None:
    with open(sys.argv[1], "rb") as handle:
        document = tomllib.load(handle)
    lines = document["build-system"]["requires"] + requirements(document["project"], sys.argv[2:])
    print("\n".join(lines))


if __name__ == "__main__":
    main()
