"""Fixtures of the runtime tests."""

from __future__ import annotations

import pytest

from streams.settings import Settings


@pytest.fixture
def offline_runtime(tmp_path):
    """`make(app_id, **env)`: a `Runtime` on RocksDB stores in a temporary data dir, with no
    registry and nothing started (no broker needed until something is consumed or sent)."""
    from streams.composition import create_runtime

    def make(app_id: str, **env: str):
        return create_runtime(Settings.from_env({
            "MEMSTREAM_REGISTRY_URL": "", "MEMSTREAM_STORE": "rocksdb://", "MEMSTREAM_DATA_DIR": str(tmp_path),
            "MEMSTREAM_APP_ID": app_id, **env}))
    return make
