"""``python -m agent``: the same as the ``topology-agent`` command."""

from agent.cli import main

raise SystemExit(main())
