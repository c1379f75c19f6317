"""Domain names as this project keeps them: lower case, no trailing dot (``www.example.test``).

PowerDNS hands names to the pipe backend without the trailing dot and in the letter case the client
used; plans and configs may be written with or without the dot. Everything is compared in this one
normal form.
"""

from __future__ import annotations

import re

_LABEL = re.compile(r"(?!-)[a-z0-9_-]{1,63}(?<!-)")
MAX_NAME_LENGTH = 253


def normalize(name: str) -> str:
    """Return ``name`` lower-cased without a trailing dot; the root stays ``""``."""
    name = name.strip().lower()
    return name[:-1] if name.endswith(".") else name


def name_problem(name: str, *, wildcard: bool = False) -> str | None:
    """Why the normalized ``name`` is not a valid host or zone name, or None when it is.

    ``wildcard`` allows ``*`` as the first label (static records only).
    """
    if not name:
        return "must not be empty"
    if len(name) > MAX_NAME_LENGTH:
        return f"longer than {MAX_NAME_LENGTH} characters"
    labels = name.split(".")
    for index, label in enumerate(labels):
        if label == "*" and wildcard and index == 0:
            continue
        if not _LABEL.fullmatch(label):
            return f"label {label!r} is not a valid DNS label"
    return None


def is_within(name: str, zone: str) -> bool:
    """True when ``name`` is ``zone`` itself or below it (both normalized)."""
    return name == zone or name.endswith("." + zone)
