"""``python -m dnslb`` is the ``dnslb`` command."""

from cli.main import main

raise SystemExit(main())
