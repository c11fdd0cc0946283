"""The `followups` command: migrate, create-project, worker, dev."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from followups.cli import build_parser
from followups.runner import SERVICES
from tests.helpers import followups, start_worker


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


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.mark.slow
def test_dev_runs_everything_embedded_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    port = _free_port()
    env = {"LOG_JSON": "false", "DATABASE_URL": "", "AMQP_URL": ""}
    dev = followups("dev", "--demo", "--data-dir", str(tmp_path), "--port", str(port), env=env)
    try:
        key = dev.wait_for("API key", timeout=90).split()[-1]
        dev.wait_for(f"http://127.0.0.1:{port}", timeout=5)
        dev.wait_for("step queued")  # the demo's first steps are due at once
        dev.wait_for("Application startup complete")
        response = httpx.get(
            f"http://127.0.0.1:{port}/v1/contacts", headers={"Authorization": f"Bearer {key}"}, timeout=10
        )
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        assert len(body["items"]) == 3
    finally:
        code = dev.stop(signal.SIGINT)
    assert code == 0, dev.output
    assert (tmp_path / "pgdata" / "PG_VERSION").exists()  # the data folder is kept for the next run
    assert not (tmp_path / "pgdata" / "postmaster.pid").exists(), "embedded PostgreSQL left running"
