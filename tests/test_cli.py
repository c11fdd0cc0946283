"""The `followups` command: migrate, create-project, worker, how `dev` logs (tests/test_dev.py runs it)."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from followups.cli import _log_settings, build_parser
from followups.runner import SERVICES
from libs.common.core.logs import TextFormatter
from libs.common.core.settings import Settings
from tests.helpers import start_worker


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "followups", *args],
        env=os.environ | env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_migrate_on_a_migrated_database_applies_nothing(db_url: str) -> None:
    result = run_cli("migrate", env={"DATABASE_URL": db_url})
    assert result.returncode == 0, result.stderr
    assert "0 migration(s) applied" in result.stdout


def test_create_project_prints_an_id_and_a_key_stored_only_hashed(db_url: str) -> None:
    result = run_cli("create-project", "Acme", env={"DATABASE_URL": db_url})
    assert result.returncode == 0, result.stderr
    fields = dict(line.split(": ", 1) for line in result.stdout.strip().splitlines())
    assert fields["api_key"].startswith("fu_")
    with psycopg.connect(db_url) as conn:
        row = conn.execute("SELECT name FROM projects WHERE id = %s", (fields["project_id"],)).fetchone()
        keys = conn.execute("SELECT key_hash, prefix FROM api_keys").fetchall()
    assert row == ("Acme",)
    assert len(keys) == 1
    assert fields["api_key"].encode() not in keys[0][0]  # only the hash is stored
    assert keys[0][1] == fields["api_key"][:8]


def test_a_worker_needs_amqp_url(db_url: str) -> None:
    result = run_cli("worker", "release", env={"DATABASE_URL": db_url, "AMQP_URL": ""})
    assert result.returncode == 2
    assert "AMQP_URL" in result.stderr


def test_unknown_worker_service_is_refused() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["worker", "mailer"])


@pytest.mark.rabbitmq
@pytest.mark.parametrize("service", sorted(SERVICES))
def test_each_worker_starts_and_stops_cleanly(service: str, db_url: str, amqp_url: str) -> None:
    worker = start_worker(service, {"DATABASE_URL": db_url, "AMQP_URL": amqp_url})
    try:
        worker.wait_for("services started")
    finally:
        code = worker.stop()
    assert code == 0, worker.output


def test_create_project_without_a_database_is_refused_with_a_clear_message() -> None:
    result = run_cli("create-project", "Acme", env={"DATABASE_URL": ""})
    assert result.returncode == 2
    assert "DATABASE_URL" in result.stderr and "--data-dir" in result.stderr
    assert "Traceback" not in result.stderr


def test_create_project_in_a_folder_without_an_embedded_database_is_refused(tmp_path: Path) -> None:
    result = run_cli("create-project", "Acme", "--data-dir", str(tmp_path / "nowhere"), env={})
    assert result.returncode == 2
    assert "no embedded database" in result.stderr and "followups dev --data-dir" in result.stderr
    assert not (tmp_path / "nowhere").exists()


def test_create_project_with_a_bad_name_is_a_message_not_a_traceback(db_url: str) -> None:
    result = run_cli("create-project", " ", env={"DATABASE_URL": db_url})
    assert result.returncode == 2
    assert "name must be" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("command", "log_json", "expected"),
    [
        ("dev", None, False),
        ("dev", "", False),
        ("dev", "true", True),
        ("dev", "false", False),
        ("api", None, True),
        ("worker", None, True),
        ("worker", "false", False),
    ],
)
def test_dev_logs_plain_text_unless_log_json_is_set(
    monkeypatch: pytest.MonkeyPatch, command: str, log_json: str | None, expected: bool
) -> None:
    if log_json is None:
        monkeypatch.delenv("LOG_JSON", raising=False)
    else:
        monkeypatch.setenv("LOG_JSON", log_json)
    assert _log_settings(Settings.from_env(), command).json is expected


def test_a_plain_log_line_has_time_level_logger_message_and_the_ids() -> None:
    record = logging.LogRecord("followups.runner", logging.INFO, __file__, 1, "services started", None, None)
    record.__dict__.update(
        services=["release", "triggers"],
        enrollment_id="0b9e",
        reason="no number",
        color_message="\x1b[1mservices started\x1b[0m",
    )
    line = TextFormatter().format(record)
    assert re.fullmatch(
        r"\d\d:\d\d:\d\d\.\d{3} INFO    followups\.runner: services started"
        r' services=release,triggers enrollment_id=0b9e reason="no number"',
        line,
    ), line
