"""MEMSTREAM_WARM_UP: on by default (a worker loads the core's compiled loops before its first
batch), `false` skips it (the test suite's workers). The warm-up itself: tests/core/test_warmup.py."""

from __future__ import annotations

import pytest

from streams.settings import Settings, SettingsError


def test_the_warm_up_is_on_by_default_and_off_with_false():
    assert Settings.from_env({}).warm_up is True
    assert Settings.from_env({"MEMSTREAM_WARM_UP": "false"}).warm_up is False
    assert Settings.from_env({"MEMSTREAM_WARM_UP": "true"}).warm_up is True


def test_a_warm_up_value_that_is_not_a_boolean_is_a_settings_error():
    with pytest.raises(SettingsError, match="MEMSTREAM_WARM_UP"):
        Settings.from_env({"MEMSTREAM_WARM_UP": "sometimes"})
