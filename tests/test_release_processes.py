"""Several release worker processes side by side: every step exactly once, no deadlock; and the same
when workers are killed mid-drain, or RabbitMQ goes away mid-run and comes back (events relayed after)."""

from __future__ import annotations

import json
import signal
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest

from benchmarks.seed import seed_due_enrollments, seed_project
from tests.helpers import EventsConsumer, Process, start_worker, stop_all, wait_until
from tests.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.rabbitmq, pytest.mark.slow]

ENROLLMENTS = 2000
WORKERS = 4

#: Due enrollments of the failure tests: a drain long enough to fail something in the middle of it.
DRAIN = 1000


def seed(db_url: str, count: int = ENROLLMENTS) -> None:
    """``count`` enrollments of a one-step sequence, due now."""
    with psycopg.connect(db_url) as conn:
        project_id, sequence_id = seed_project(conn)
        seed_due_enrollments(
            conn, project_id, sequence_id, count, due_at=datetime.now(UTC) - timedelta(seconds=1)
        )


def scalar(db_url: str, query: str) -> Any:
    with psycopg.connect(db_url) as conn:
        row = conn.execute(query).fetchone()
    assert row is not None
    return row[0]


def released(db_url: str) -> int:
    """Enrollments released so far (each one step: released means completed)."""
    count: int = scalar(db_url, "SELECT count(*) FROM followup_enrollments WHERE status <> 'active'")
    return count


def unpublished(db_url: str) -> int:
    count: int = scalar(db_url, "SELECT count(*) FROM outbox WHERE published_at IS NULL")
    return count


def assert_each_step_queued_once(db_url: str, count: int = ENROLLMENTS) -> None:
    """Every enrollment completed with exactly one message and one step run: none lost, none doubled."""
    with psycopg.connect(db_url) as conn:
        messages = conn.execute(
            "SELECT count(*), count(DISTINCT followup_enrollment_id) FROM messages WHERE source = 'followup'"
        ).fetchone()
        statuses = conn.execute(
            "SELECT status, count(*) FROM followup_enrollments GROUP BY status"
        ).fetchall()
        runs = conn.execute("SELECT count(*) FROM followup_step_runs WHERE outcome = 'queued'").fetchone()
    assert messages == (count, count)
    assert runs == (count,)
    assert statuses == [("completed", count)]


def assert_every_event_relayed(db_url: str, consumer: EventsConsumer, count: int = ENROLLMENTS) -> None:
    """Every followup.step_queued of the outbox reached the exchange (at least once: ids deduplicated)."""
    with psycopg.connect(db_url) as conn:
        expected = {
            str(row[0])
            for row in conn.execute("SELECT event_id FROM outbox WHERE type = 'followup.step_queued'")
        }
    assert len(expected) == count
    seen: set[str] = set()

    def all_seen(key: str, envelope: dict[str, Any]) -> bool:
        seen.add(envelope["id"])
        return seen >= expected

    consumer.wait_for(all_seen, timeout=60)


def logged(worker: Process, logger: str, level: str) -> list[str]:
    """The messages ``worker`` logged (JSON lines) from ``logger`` at ``level``."""
    found = []
    for line in worker.lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("logger", "").startswith(logger) and entry.get("level") == level:
            found.append(entry["message"])
    return found


def test_four_release_workers_queue_each_step_exactly_once(db_url: str, amqp_url: str) -> None:
    # Given 2,000 due enrollments
    with psycopg.connect(db_url) as conn:
        project_id, sequence_id = seed_project(conn)
        seed_due_enrollments(
            conn, project_id, sequence_id, ENROLLMENTS, due_at=datetime.now(UTC) - timedelta(seconds=1)
        )
        deadlocks_before = conn.execute(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    # When four release worker processes run side by side
    env = {"DATABASE_URL": db_url, "AMQP_URL": amqp_url, "WORKER_THREADS": "1"}
    workers = [start_worker("release", env) for _ in range(WORKERS)]

    def all_released() -> bool:
        with psycopg.connect(db_url) as conn:
            query = "SELECT count(*) FROM followup_enrollments WHERE status = 'active'"
            return conn.execute(query).fetchone() == (0,)

    try:
        wait_until(all_released, timeout=120, interval=0.1, what="every enrollment released")
    finally:
        codes = stop_all(workers)
    assert codes == [0] * WORKERS, "\n".join(w.output for w in workers)
    # Then every enrollment completed with exactly one message, and nothing deadlocked
    with psycopg.connect(db_url) as conn:
        counts = conn.execute(
            "SELECT count(*), count(DISTINCT followup_enrollment_id) FROM messages WHERE source = 'followup'"
        ).fetchone()
        query = "SELECT status, count(*) FROM followup_enrollments GROUP BY status"
        statuses = conn.execute(query).fetchall()
        runs = conn.execute("SELECT count(*) FROM followup_step_runs WHERE outcome = 'queued'").fetchone()
        deadlocks_after = conn.execute(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    assert counts == (ENROLLMENTS, ENROLLMENTS)
    assert runs == (ENROLLMENTS,)
    assert statuses == [("completed", ENROLLMENTS)]
    assert deadlocks_after == deadlocks_before
    # every worker took part (SKIP LOCKED spreads the claims)
    for worker in workers:
        assert any("step queued" in line for line in worker.lines), worker.output


def test_release_workers_killed_mid_drain_lose_and_double_nothing(db_url: str, amqp_url: str) -> None:
    # Given 1,000 due enrollments drained by four release workers
    seed(db_url, DRAIN)
    exchange = f"followups.events.test.{uuid.uuid4().hex[:8]}"
    consumer = EventsConsumer(amqp_url, exchange, ("followup.step_queued",))
    env = {
        "DATABASE_URL": db_url,
        "AMQP_URL": amqp_url,
        "EVENTS_EXCHANGE": exchange,
        "WORKER_THREADS": "1",
        "WORKER_IDLE_MAX_SLEEP_SECONDS": "1",
    }
    workers = [start_worker("release", env) for _ in range(WORKERS)]
    try:
        # When two of them are killed (-9) mid-drain, and two others start in their place
        wait_until(lambda: released(db_url) >= DRAIN // 5, timeout=60, what="a fifth released")
        killed = workers[:2]
        for worker in killed:
            worker.send(signal.SIGKILL)
        assert [worker.wait_exit() for worker in killed] == [-signal.SIGKILL] * 2
        assert released(db_url) < DRAIN, "killed after the drain: the test proves nothing"
        survivors = [*workers[2:], *(start_worker("release", env) for _ in range(2))]
        for worker in survivors:  # the two others may drain it all while these start: a stop then kills them
            worker.wait_for("services started")
        wait_until(lambda: released(db_url) == DRAIN, timeout=120, interval=0.1, what="all released")
        wait_until(lambda: unpublished(db_url) == 0, timeout=30, interval=0.1, what="every event relayed")
        codes = stop_all(survivors)
        assert codes == [0] * len(survivors), "\n".join(w.output for w in survivors)
        # Then every step was queued exactly once, and every event reached the exchange
        assert_each_step_queued_once(db_url, DRAIN)
        assert_every_event_relayed(db_url, consumer, DRAIN)
    finally:
        stop_all([w for w in workers if w.popen.poll() is None], sig=signal.SIGKILL)
        consumer.close()


def test_rabbitmq_gone_mid_run_slows_nothing_and_the_events_follow_when_it_is_back(
    db_url: str, amqp_url: str
) -> None:
    # Given four release workers draining 1,000 due enrollments, with RabbitMQ behind a proxy
    seed(db_url, DRAIN)
    exchange = f"followups.events.test.{uuid.uuid4().hex[:8]}"
    consumer = EventsConsumer(amqp_url, exchange, ("followup.step_queued",))
    target = urlsplit(amqp_url)
    proxy = TcpProxy((target.hostname or "127.0.0.1", target.port or 5672))
    proxied = target._replace(netloc=f"{target.username}:{target.password}@127.0.0.1:{proxy.port}")
    env = {
        "DATABASE_URL": db_url,
        "AMQP_URL": proxied.geturl(),
        "EVENTS_EXCHANGE": exchange,
        "WORKER_THREADS": "1",
        "WORKER_IDLE_MAX_SLEEP_SECONDS": "1",
    }
    workers = [start_worker("release", env) for _ in range(WORKERS)]
    try:
        for worker in workers:
            worker.wait_for("services started")
        wait_until(lambda: released(db_url) >= DRAIN // 5, timeout=60, what="a fifth released")
        # When RabbitMQ goes away (its connections dropped, new ones refused)
        proxy.down()
        at_outage = released(db_url)
        # Then the workers drain on (they poll PostgreSQL), and the events wait in the outbox
        wait_until(
            lambda: released(db_url) >= at_outage + DRAIN // 5,
            timeout=60,
            what="releases going on without RabbitMQ",
        )
        wait_until(lambda: unpublished(db_url) > 0, timeout=10, what="events waiting in the outbox")
        # (a relay tries again on its own time: RabbitMQ comes back once one has met the outage)
        wait_until(
            lambda: any(logged(w, "libs.common.core.outbox", "warning") for w in workers),
            timeout=30,
            what="a relay meeting the outage",
        )
        assert released(db_url) < DRAIN, "RabbitMQ back after the drain: the test proves less"
        # When RabbitMQ is back
        proxy.up()
        wait_until(lambda: released(db_url) == DRAIN, timeout=120, interval=0.1, what="all released")
        wait_until(lambda: unpublished(db_url) == 0, timeout=30, interval=0.1, what="every event relayed")
        codes = stop_all(workers)
        assert codes == [0] * WORKERS, "\n".join(w.output for w in workers)
    finally:
        stop_all([w for w in workers if w.popen.poll() is None], sig=signal.SIGKILL)
        proxy.close()
    # Then every step was queued exactly once, every event relayed after the outage
    try:
        assert_each_step_queued_once(db_url, DRAIN)
        assert_every_event_relayed(db_url, consumer, DRAIN)
    finally:
        consumer.close()
    # and each worker said so once per sender (a warning when it started, an info when it ended), and pika
    # printed nothing
    for worker in workers:
        for logger in ("libs.common.core.outbox", "libs.common.core.invalidation"):
            assert len(logged(worker, logger, "warning")) <= 1, worker.output
        assert not [line for line in worker.lines if '"logger": "pika' in line], worker.output
    relays = [logged(worker, "libs.common.core.outbox", "warning") for worker in workers]
    assert any(relays), "no relay noticed the outage"
