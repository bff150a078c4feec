from pathlib import Path

import statelog
from tests.helpers import build_store, model_at, simple_commits, snapshot_of


def test_reopen_replays_every_commit(store_path: Path) -> None:
    models = build_store(store_path, simple_commits(20))
    with statelog.open(store_path) as store:
        assert store.epoch == 20
        assert store.recovery.replayed == 20
        assert store.recovery.outcome is statelog.Outcome.CLEAN
        assert snapshot_of(store) == model_at(models, 20)
