"""Active health checks, by name: ``tcp`` (a connection opens) and ``http`` (a GET answers).

Each check lives in its own module, its configuration class beside it, and registers both with
``@register(ItsConfig)`` (:mod:`manager.checks.base`). The imports below are the registry: a new
check is one module and one line here. :func:`create_check` builds the check a pool's
configuration names; :class:`HealthCheckConfig` is the type of that ``health_check`` block.
:mod:`manager.health` runs them.
"""

from __future__ import annotations

from manager.checks import http as http
from manager.checks import tcp as tcp
from manager.checks.base import HealthCheck, HealthCheckConfig, create_check, register
from manager.checks.http import HttpCheck
from manager.checks.tcp import TcpCheck

__all__ = [
    "HealthCheck",
    "HealthCheckConfig",
    "HttpCheck",
    "TcpCheck",
    "create_check",
    "register",
]
