"""What the benchmarks share: a database of their own on the configured server, and percentiles."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from multiprocessing.process import BaseProcess
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg_pool import ConnectionPool

from libs.common.core.migrate import migrate


def server_url() -> str:
    return os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


@contextmanager
def bench_database(name: str) -> Iterator[str]:
    """A freshly migrated database ``name`` on the configured server, dropped afterwards. A server with
    autovacuum off is named: the figures it gives are not what production (autovacuum on) gives."""
    server = server_url()
    with psycopg.connect(server, autocommit=True) as conn:
        if (autovacuum := conn.execute("SHOW autovacuum").fetchone()) and autovacuum[0] == "off":
            print(
                "  note: autovacuum is off on this server: dead rows and dead index entries pile up from"
                " round to round, which they do not with autovacuum on (docs/operations.md)"
            )
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")
    url = urlunsplit(urlsplit(server)._replace(path=f"/{name}"))
    migrate(url)
    try:
        yield url
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def start_all(processes: Iterable[BaseProcess], ready: Any) -> None:
    """Start each process and wait until each has released ``ready`` (a semaphore: connected, waiting for
    the signal to go)."""
    started = list(processes)
    for process in started:
        process.start()
    for _ in started:
        ready.acquire()


def run_until_done(processes: Sequence[BaseProcess], ready: Any, go: Any) -> float:
    """Start each process, wait until each is ready (:func:`start_all`), signal ``go`` and wait until every
    one exited: the seconds from the signal to the last exit."""
    start_all(processes, ready)
    started = time.perf_counter()
    go.set()
    for process in processes:
        process.join()
    return time.perf_counter() - started


def cpu_ms_per(cpus: Iterable[Any], count: int) -> tuple[float, float | None]:
    """What processes left in their shared pairs of doubles (their CPU seconds, their backends': -1 when
    not on this machine; :class:`CpuUsed`), in ms per one of ``count`` items: (theirs, their backends' or
    None)."""
    pairs = [(cpu[0], cpu[1]) for cpu in cpus]
    own = sum(used for used, _ in pairs) * 1000 / count
    backends = [used for _, used in pairs]
    return own, sum(backends) * 1000 / count if all(used >= 0 for used in backends) else None


def rss_mb(pid: int) -> float:
    """The resident set size of process ``pid`` in MB (Linux ``/proc``)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def cpu_seconds(pid: int) -> float | None:
    """The CPU time (user + system) process ``pid`` has used, in seconds (Linux ``/proc``); None when it is
    not a process of this machine (a database elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuUsed:
    """The CPU a benchmark's worker process and its database backend (the one connection of ``pool``) use
    from :meth:`start` on."""

    def __init__(self, pool: ConnectionPool) -> None:
        with pool.connection() as conn:
            row = conn.execute("SELECT pg_backend_pid()").fetchone()
        self.backend_pid = int(row[0]) if row is not None else 0
        self.own_started = 0.0
        self.backend_started: float | None = None

    def start(self) -> None:
        self.own_started, self.backend_started = time.process_time(), cpu_seconds(self.backend_pid)

    def seconds(self) -> tuple[float, float]:
        """(the worker's CPU seconds, its backend's: -1 when the backend is not a process of this machine)."""
        ended = cpu_seconds(self.backend_pid)
        started = self.backend_started
        backend = ended - started if started is not None and ended is not None else -1.0
        return time.process_time() - self.own_started, backend


def percentile(values: list[float], pct: float) -> float:
    """The ``pct`` percentile (nearest rank) of ``values``."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]
