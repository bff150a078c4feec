"""``python -m statelog.cli``: the ``statelog`` command."""

from . import main

raise SystemExit(main())
