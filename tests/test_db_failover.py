"""PostgreSQL lost and found, as a process's log and pool see it.

- An outage reads well: a worker loop whose PostgreSQL goes away (a TCP proxy dropping every connection)
  logs one warning and, once it is back, one info; no traceback per tick, no line per pool attempt.
- A multi-host ``DATABASE_URL`` with ``target_session_attrs=read-write`` follows the primary: on a primary
  and its streaming standby the test starts itself (initdb, pg_basebackup), the pool writes to the
  primary, then after a kill -9 of it and the standby's promotion, to the new one; a server that stops
  taking writes under the pool (fenced read-only) is left for good connections only.

The servers are skipped locally when PostgreSQL's server binaries are missing; a failure under ``CI``.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg_pool import ConnectionPool, PoolTimeout

from benchmarks.patroni import SERVER_USER, pg_bin
from benchmarks.rabbitmq_cluster import free_port
from libs.common.core.db import DATABASE, create_pool, map_errors
from libs.common.core.errors import DatabaseUnavailable
from libs.common.core.loops import PollingLoop
from libs.common.core.settings import DatabaseSettings
from tests.helpers import wait_until
from tests.tcp_proxy import proxied_postgres

HEAL = 30


def _records(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level]


def test_a_worker_loop_logs_an_outage_once_when_it_starts_and_once_when_it_ends(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    proxy, url = proxied_postgres(db_url)
    pool = create_pool(DatabaseSettings(url=url, pool_min_size=1, pool_max_size=2, pool_timeout_seconds=0.5))
    ticks: list[bool] = []

    def tick() -> int:
        with pool.connection() as conn:
            conn.execute("SELECT 1")
        ticks.append(True)
        return 0

    loop = PollingLoop("outage-probe", tick, poll_interval=0.05, idle_max_sleep=0.1)
    DATABASE.succeeded()  # whatever an earlier test left
    caplog.set_level(logging.INFO)
    loop.start()
    try:
        wait_until(lambda: ticks, what="a first tick")
        caplog.clear()
        # When PostgreSQL goes away for long enough for many ticks and pool attempts to fail
        proxy.down()
        wait_until(lambda: DATABASE.down, timeout=HEAL, what="the outage noticed")
        failing = len(ticks)
        time.sleep(2)  # the outage itself: ~20 ticks, each failing
        assert len(ticks) == failing
        proxy.up()
        wait_until(lambda: len(ticks) > failing, timeout=HEAL, what="ticking again")
    finally:
        loop.stop()
        pool.close()
        proxy.close()
    # Then one warning, one info, and no traceback nor pool line in between
    warnings = _records(caplog, logging.WARNING)
    assert warnings == ["PostgreSQL unreachable: requests answer 503 and the loops retry until it answers"]
    assert _records(caplog, logging.INFO).count("PostgreSQL answers again") == 1
    assert not _records(caplog, logging.ERROR)
    assert not [r for r in caplog.records if r.exc_info]


# --- a primary and its standby ----------------------------------------------------------------------------


class Server:
    """One PostgreSQL server of the test's, on 127.0.0.1:``port``."""

    def __init__(self, bin_dir: Path, data: Path, port: int) -> None:
        self.bin, self.data, self.port = bin_dir, data, port

    def run(self, tool: str, *args: str, check: bool = True) -> int:
        user = SERVER_USER if os.geteuid() == 0 else None
        done = subprocess.run(
            [str(self.bin / tool), *args], capture_output=True, text=True, timeout=120, user=user
        )
        assert done.returncode == 0 or not check, f"{tool}: {done.stdout}{done.stderr}"
        return done.returncode

    def start(self) -> None:
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.data} -c fsync=off"
        self.run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.data / "log"), "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        self.run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def execute(self, sql: str) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(sql.encode())


@pytest.fixture
def primary_and_standby() -> Iterator[tuple[Server, Server]]:
    bin_dir = pg_bin()
    if bin_dir is None or not (bin_dir / "pg_basebackup").exists():
        if os.environ.get("CI"):
            pytest.fail("PostgreSQL's server binaries are not installed and CI is set")
        # a machine with Python alone (make test's contract) may lack them; CI has them, and fails above
        pytest.skip("PostgreSQL's server binaries (initdb, pg_basebackup) are not installed")
    # a folder of its own the server's user may enter (pytest's tmp_path is root's only, under root)
    folder = Path(tempfile.mkdtemp(prefix="followups-failover-"))
    if os.geteuid() == 0:
        shutil.chown(folder, SERVER_USER)
    primary = Server(bin_dir, folder / "a", free_port())
    standby = Server(bin_dir, folder / "b", free_port())
    try:
        yield from _started(primary, standby)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _started(primary: Server, standby: Server) -> Iterator[tuple[Server, Server]]:
    primary.run("initdb", "-D", str(primary.data), "-U", "postgres", "--auth=trust")
    primary.start()
    started = [primary]
    try:
        standby.run(
            "pg_basebackup", "-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres",
            "-D", str(standby.data), "-R", "-X", "stream",
        )  # fmt: skip
        standby.start()
        started.append(standby)
        yield primary, standby
    finally:
        for server in started:
            if server.run("pg_ctl", "-D", str(server.data), "status", check=False) == 0:
                server.stop("immediate")


def _write(pool: ConnectionPool) -> int:
    """Insert a row through the pool; the port of the server that took it."""
    with map_errors(), pool.connection() as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS probe (n int)")
        conn.execute("INSERT INTO probe VALUES (1)")
        row = conn.execute("SELECT inet_server_port()").fetchone()
    assert row is not None
    return int(row[0])


def test_the_pool_follows_the_primary_and_leaves_a_server_that_no_longer_takes_writes(
    primary_and_standby: tuple[Server, Server],
) -> None:
    primary, standby = primary_and_standby
    url = (
        f"postgresql://postgres@127.0.0.1:{primary.port},127.0.0.1:{standby.port}/postgres"
        "?target_session_attrs=read-write"
    )
    pool = create_pool(DatabaseSettings(url=url, pool_min_size=2, pool_max_size=2, pool_timeout_seconds=1))
    try:
        # Given the pool writing to the primary (the standby, listed too, takes no writes)
        assert {_write(pool) for _ in range(4)} == {primary.port}

        # When the primary dies and the standby is promoted
        primary.stop("immediate")
        standby.run("pg_ctl", "-D", str(standby.data), "-w", "promote")

        # Then within seconds the pool writes to the new primary, without a restart
        def writes_to_the_new_primary() -> bool:
            try:
                return _write(pool) == standby.port
            except DatabaseUnavailable:
                return False

        wait_until(writes_to_the_new_primary, timeout=HEAL, interval=0.2, what="writing to the new primary")

        # And when that server stops taking writes under the pool (fenced read-only), a write is a
        # DatabaseUnavailable (a 503), and the connections to it are dropped: none is handed out again
        standby.execute("ALTER SYSTEM SET default_transaction_read_only = on")
        standby.execute("SELECT pg_reload_conf()")
        wait_until(_refused(pool), timeout=HEAL, interval=0.2, what="the read-only server left")
        # and once it takes writes again, the pool connects to it anew
        standby.execute("ALTER SYSTEM RESET default_transaction_read_only")
        standby.execute("SELECT pg_reload_conf()")
        wait_until(writes_to_the_new_primary, timeout=HEAL, interval=0.2, what="writing again")
    finally:
        pool.close()


def _refused(pool: ConnectionPool) -> Callable[[], bool]:
    """A predicate: True once the pool has no connection to give (PoolTimeout): it kept none to the
    read-only server and libpq finds no server taking writes."""

    def refused() -> bool:
        try:
            _write(pool)
        except DatabaseUnavailable as exc:
            return isinstance(exc.__cause__, PoolTimeout)
        return False

    return refused
