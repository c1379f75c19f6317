"""dnslb: a DNS-based load balancer and autoscaler for web services.

This package is the shared core every component imports: the plan format (:mod:`dnslb.plan`),
answer selection (:mod:`dnslb.selection`), plan stores, errors and the ``dnslb`` command.
It imports only the standard library at import time, so that the pipe backend starts fast.
"""

__version__ = "0.1.0"
