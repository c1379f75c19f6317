"""``python -m cli`` is the ``dnslb`` command (what the project runs in its own subprocesses)."""

from cli.main import main

raise SystemExit(main())
