"""``python -m dnslb`` is the ``dnslb`` command."""

from dnslb.cli import main

raise SystemExit(main())
