"""The manager: turns agents' reports into plans and dispatch tables, and scales pools."""
