from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from libs.common.core.settings import ENVIRONMENT, Settings, SettingsError, markdown_table

ROOT = Path(__file__).resolve().parent.parent


def test_defaults_load_without_any_variable() -> None:
    settings = Settings.from_env({})
    assert settings.api.port == 8000
    assert settings.followup.max_failures >= 1
    assert settings.broker.amqp_url is None


def test_values_are_converted_from_strings() -> None:
    settings = Settings.from_env(
        {
            "API_PORT": "9001",
            "LOG_JSON": "false",
            "WORKER_POLL_INTERVAL_SECONDS": "0.5",
            "FOLLOWUP_MAX_FAILURES": "3",
        }
    )
    assert settings.api.port == 9001
    assert settings.log.json is False
    assert settings.worker.poll_interval_seconds == 0.5
    assert settings.followup.max_failures == 3


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("API_PORT", "eighty"),
        ("API_PORT", "70000"),
        ("DATABASE_URL", "mysql://localhost/x"),
        ("DATABASE_POOL_MAX_SIZE", "0"),
        ("AMQP_URL", "http://rabbit"),
        ("WORKER_POLL_INTERVAL_SECONDS", "-1"),
        ("FOLLOWUP_MAX_FAILURES", "1.5"),
        ("LOG_LEVEL", "LOUD"),
        ("LOG_JSON", "perhaps"),
    ],
)
def test_a_bad_value_is_rejected_naming_the_variable(name: str, value: str) -> None:
    with pytest.raises(SettingsError, match=name):
        Settings.from_env({name: value})


def test_the_process_stops_at_start_naming_the_variable() -> None:
    env = os.environ | {"DATABASE_POOL_MAX_SIZE": "lots"}
    result = subprocess.run(
        [sys.executable, "-m", "followups", "migrate"], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "DATABASE_POOL_MAX_SIZE" in result.stderr


def test_every_variable_is_documented_in_the_readme_table() -> None:
    readme = (ROOT / "README.md").read_text()
    assert markdown_table() in readme, (
        "README configuration table is stale: paste `python -m libs.common.core.settings`"
    )
    for variables in ENVIRONMENT.values():
        for var in variables:
            assert var.help.strip(), f"{var.name} has no description"


@pytest.mark.parametrize(
    ("name", "value", "secret"),
    [
        ("DATABASE_URL", "mysql://app:s3cret-pw@db/app", "s3cret-pw"),
        ("AMQP_URL", "http://guest:rabbit-pw@rabbit:5672", "rabbit-pw"),
        ("AI_BASE_URL", "ftp://user:model-pw@models", "model-pw"),
    ],
)
def test_a_bad_value_is_named_without_its_password(name: str, value: str, secret: str) -> None:
    with pytest.raises(SettingsError) as error:
        Settings.from_env({name: value})
    assert name in str(error.value)
    assert secret not in str(error.value)
    assert "***" in str(error.value)
