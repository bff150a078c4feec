"""``python -m statelog.cli``: the ``statelog`` command."""

from statelog.cli import main

raise SystemExit(main())
