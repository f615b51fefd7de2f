"""Proxy mode's configuration: bad values stop start-up with a message naming the key."""

from __future__ import annotations

import subprocess
import sys

import pytest

from coordinator.config import ConfigError, load_config


def test_upstream_and_groups_parse_from_set() -> None:
    config = load_config(None, ["proxy.upstream=kafka-1:9092, kafka-2:9093",
                                "proxy.groups=connect-(a|b)"])
    assert config.proxy_mode
    assert config.proxy_upstream == ("kafka-1:9092", "kafka-2:9093")
    assert config.proxy_groups == "connect-(a|b)"
    assert not load_config(None, []).proxy_mode


@pytest.mark.parametrize(("settings", "message"), [
    (["proxy.upstream=kafka-1:9092"], "proxy.groups"),
    (["proxy.upstream=kafka-1", "proxy.groups=x"], "proxy.upstream"),
    (["proxy.upstream=kafka-1:99999", "proxy.groups=x"], "proxy.upstream"),
    (["proxy.upstream=kafka-1:9092", "proxy.groups=connect-("], "regular expression"),
    (["proxy.coordinator.node.id=-1"], "proxy.coordinator.node.id"),
])
def test_bad_proxy_settings_are_refused_with_the_key(settings: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, settings)


def test_serve_refuses_proxy_mode_without_owned_groups() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "coordinator.cli", "serve", "--in-memory",
         "--upstream", "127.0.0.1:9092"], capture_output=True, text=True, timeout=60,
        check=False)
    assert completed.returncode == 2
    assert "proxy.groups" in completed.stderr
