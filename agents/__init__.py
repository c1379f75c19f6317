"""Agents that run beside the servers dnslb balances and report to the manager.

:mod:`agents.agent` is the agent of a cache server (``dnslb agent --config FILE``): every
second it reads the requests in progress from a utilization source (:mod:`agents.sources`),
adds the machine's CPU and memory (:mod:`agents.host`) and posts a
:class:`~dnslb.report.Report` to the manager (:mod:`agents.manager_client`).
"""
