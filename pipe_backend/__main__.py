"""``python -P -m pipe_backend --plan PLAN``: the coprocess pdns's ``pipe-command`` runs."""

from pipe_backend.command import main

raise SystemExit(main())
