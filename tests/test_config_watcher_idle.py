"""`[supervision] watcher_idle_minutes`: 0 (never) or more minutes; anything else is a clear
error naming the key."""

from __future__ import annotations

import pytest

from memd.config import ConfigError
from memd.config.parse import parse_config


def test_default_is_ten_minutes_and_zero_means_never() -> None:
    assert parse_config({}).supervision.watcher_idle_minutes == 10.0
    config = parse_config({"supervision": {"watcher_idle_minutes": 0}})
    assert config.supervision.watcher_idle_minutes == 0.0
    config = parse_config({"supervision": {"watcher_idle_minutes": 0.5}})
    assert config.supervision.watcher_idle_minutes == 0.5


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), "ten", True])
def test_a_bad_value_names_the_key(bad: object) -> None:
    with pytest.raises(ConfigError, match="watcher_idle_minutes"):
        parse_config({"supervision": {"watcher_idle_minutes": bad}})
