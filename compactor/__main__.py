"""``python -m compactor``: the same as the ``statelog-compactor`` console script."""

from compactor.daemon import main

raise SystemExit(main())
