"""The REST API, the Prometheus metrics and the dashboard, served by the manager's process.

Imports only :mod:`dnslb`: the manager is reached through :class:`dnslb.control.ManagerControl`.
``api.app.create_app`` builds the FastAPI application; ``cli.ctl`` is the ``dnslb ctl`` client.
This module stays empty so that ``dnslb ctl`` does not import FastAPI.
"""
