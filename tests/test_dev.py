"""``followups dev`` in a process of its own on a temporary data folder: what it prints, the API key it keeps
across runs, and ``create-project --data-dir`` on its embedded database, running or not."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import Process, followups, wait_until

#: The environment of every run: plain logs by default (LOG_JSON unset), no server named, and no
#: XDG_RUNTIME_DIR, so that platformdirs' warning about it would show.
ENV = {"LOG_JSON": "", "DATABASE_URL": "", "AMQP_URL": "", "XDG_RUNTIME_DIR": ""}

BOX_LINE = re.compile(r"^\| (.*?) *\|$")
PLAIN_LOG_LINE = re.compile(r"^\d\d:\d\d:\d\d\.\d{3} (DEBUG|INFO|WARNING|ERROR) +[\w.]+: ")

pytestmark = pytest.mark.slow


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """A data folder outside pytest's ``tmp_path``: running as root, pgserver runs PostgreSQL as its own
    user and opens the folder's parents to it, which pytest takes back (it keeps ``pytest-of-<user>`` 0700
    whenever a worker starts)."""
    folder = Path(tempfile.mkdtemp(prefix="followups-dev-test-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _start(data_dir: Path, port: int, *args: str, env: dict[str, str] | None = None) -> Process:
    dev = followups("dev", "--data-dir", str(data_dir), "--port", str(port), *args, env=ENV | (env or {}))
    try:
        dev.wait_for("Ctrl-C stops.", timeout=120)
    except AssertionError:
        dev.stop(signal.SIGINT)
        raise
    return dev


def _box(dev: Process, *, last: bool = True) -> dict[str, str]:
    """The box's lines by their label (``API key``, ``DATABASE_URL``, ...); with ``last``, asserts nothing
    but blank lines was printed after it (so far)."""
    lines = dev.lines[:]
    bottom = max(i for i, line in enumerate(lines) if line.startswith("+--"))
    top = max(i for i, line in enumerate(lines[:bottom]) if line.startswith("+--"))
    if last:
        assert all(not line.strip() for line in lines[bottom + 1 :]), f"box not printed last:\n{dev.output}"
    fields: dict[str, str] = {}
    for line in lines[top + 1 : bottom]:
        match = BOX_LINE.match(line)
        assert match, line
        label, _, value = match.group(1).partition("  ")
        if label:
            fields[label.strip()] = value.strip()
    return fields


def _create_project(name: str, data_dir: Path) -> dict[str, str]:
    """``followups create-project NAME --data-dir DIR``: the project id and API key it prints."""
    result = subprocess.run(
        [sys.executable, "-m", "followups", "create-project", name, "--data-dir", str(data_dir)],
        env=os.environ | ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return dict(line.split(": ", 1) for line in result.stdout.strip().splitlines())


def _api_key(*args: str, data_dir: Path) -> str:
    """``followups api-key ARGS --data-dir DIR`` (the dev folder's project): what it prints."""
    result = subprocess.run(
        [sys.executable, "-m", "followups", "api-key", *args, "--data-dir", str(data_dir)],
        env=os.environ | ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def _contacts(port: int, key: str) -> httpx.Response:
    return httpx.get(
        f"http://127.0.0.1:{port}/v1/contacts", headers={"Authorization": f"Bearer {key}"}, timeout=10
    )


def test_dev_keeps_its_key_prints_it_last_and_creates_projects_on_its_database(data_dir: Path) -> None:
    port = _free_port()
    # Given a first run on an empty data folder
    dev = _start(data_dir, port)
    try:
        box = _box(dev)
        key = box["API key"]
        assert key.startswith("fu_")
        assert box["DATABASE_URL"].startswith("postgresql://")
        # the database's URL is printed at start too, before the services' logs
        printed = dev.lines.index(f"followups dev: DATABASE_URL={box['DATABASE_URL']}")
        assert printed < next(i for i, line in enumerate(dev.lines) if "services started" in line)
        assert box["API"].startswith(f"http://127.0.0.1:{port}")
        assert f"--data-dir {data_dir}" in box["new project"]
        # the key is kept in the data folder, readable by its owner only
        key_file = data_dir / "api_key"
        assert key_file.read_text().strip() == key
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        assert _contacts(port, key).status_code == 200
        # plain log lines, and no warning from a dependency
        logs = [line for line in dev.lines if PLAIN_LOG_LINE.match(line)]
        assert any("Uvicorn running on" in line for line in logs), dev.output
        assert not any(line.startswith("{") for line in dev.lines), dev.output
        assert "Warning" not in dev.output and "XDG_RUNTIME_DIR" not in dev.output, dev.output

        # When another project is created on the running dev's database
        second = _create_project("Second", data_dir)

        # Then its key works against the running API
        assert second["api_key"] != key
        assert _contacts(port, second["api_key"]).status_code == 200

        # And a read key of the dev project, made on the running dev's database, reads but changes nothing
        created = _api_key("create", "--name", "reports", "--scope", "read", data_dir=data_dir)
        read_key = created.splitlines()[0].removeprefix("api_key: ")
        assert _contacts(port, read_key).status_code == 200
        refused = httpx.post(
            f"http://127.0.0.1:{port}/v1/contacts",
            json={"phone": "+14155550100"},
            headers={"Authorization": f"Bearer {read_key}"},
            timeout=10,
        )
        assert refused.status_code == 403 and refused.json()["code"] == "missing_scope"
        listed = _api_key("list", data_dir=data_dir)
        assert "\treports\t" in listed and "\tdefault\t" in listed and read_key not in listed
    finally:
        code = dev.stop(signal.SIGINT)
    assert code == 0, dev.output

    # When dev runs again on the same folder
    dev = _start(data_dir, port)
    try:
        # Then it prints the same key, which still authenticates, and keeps the other project
        again = _box(dev)
        assert again["API key"] == key
        assert again["project"] == box["project"]
        assert _contacts(port, key).status_code == 200
        assert _contacts(port, second["api_key"]).status_code == 200
    finally:
        code = dev.stop(signal.SIGTERM)
    assert code == 0, dev.output
    assert not (data_dir / "pgdata" / "postmaster.pid").exists(), "embedded PostgreSQL left running"

    # And create-project --data-dir with no dev running starts the database for the moment only
    third = _create_project("Third", data_dir)
    assert third["api_key"].startswith("fu_")
    assert not (data_dir / "pgdata" / "postmaster.pid").exists(), "embedded PostgreSQL left running"


def test_dev_logs_json_when_log_json_says_so(data_dir: Path) -> None:
    port = _free_port()
    dev = _start(data_dir, port, env={"LOG_JSON": "true"})
    try:
        assert any(line.startswith('{"time"') and "Uvicorn running on" in line for line in dev.lines)
        assert _box(dev)["API key"].startswith("fu_")
    finally:
        code = dev.stop(signal.SIGINT)
    assert code == 0, dev.output


def test_dev_runs_everything_embedded_with_the_demo(data_dir: Path) -> None:
    port = _free_port()
    dev = _start(data_dir, port, "--demo")
    try:
        key = _box(dev, last=False)["API key"]
        dev.wait_for("step queued")  # the demo's first steps are due at once
        response = _contacts(port, key)
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        assert len(body["items"]) == 3
    finally:
        code = dev.stop(signal.SIGINT)
    assert code == 0, dev.output
    assert (data_dir / "pgdata" / "PG_VERSION").exists()  # the data folder is kept for the next run
    assert not (data_dir / "pgdata" / "postmaster.pid").exists(), "embedded PostgreSQL left running"


def test_dev_with_the_fake_provider_shows_what_reached_the_phone_and_its_statuses(data_dir: Path) -> None:
    port = _free_port()
    dev = _start(data_dir, port, "--demo", "--fake-provider")
    try:
        key = _box(dev, last=False)["API key"]
        dev.wait_for("reached the phone (fake WhatsApp)")

        def read_messages() -> list[dict[str, Any]]:
            answer = httpx.get(
                f"http://127.0.0.1:{port}/v1/messages",
                headers={"Authorization": f"Bearer {key}"},
                timeout=10,
            )
            assert answer.status_code == 200, answer.text
            return [m for m in answer.json()["items"] if m["status"] == "READ"]

        # the fake reports sent, delivered, then read through the number's webhook
        [read, *_] = wait_until(read_messages, timeout=30, interval=0.5, what="a message READ")
        assert read["provider_message_id"].startswith("wamid.")
    finally:
        code = dev.stop(signal.SIGINT)
    assert code == 0, dev.output
