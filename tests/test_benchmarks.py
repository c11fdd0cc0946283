"""The benchmarks keep working as the code under them changes: a small run of the release benchmark's
backlog part, of the partitions benchmark and of the outbox benchmark, through their command lines, print
their lines with their keys (figures are not judged here: performance is measured by running the
benchmarks, never by tests)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import psycopg
import pytest

pytestmark = pytest.mark.slow

DATABASE = "followups_bench_smoke"


def test_the_release_benchmarks_backlog_part_drains_both_backlogs_and_prints_its_line(
    server_url: str,
) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.release",
            "--backlog-only",
            "--backlog-small",
            "1000",
            "--backlog-large",
            "2000",
            "--database",
            DATABASE,
        ],
        env=os.environ | {"DATABASE_URL": server_url},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    last = done.stdout.strip().splitlines()[-1]
    assert re.fullmatch(
        r"release: steps_per_s_1k=\d+ steps_per_s_2k=\d+ backlog_ratio_2k_1k=\d+\.\d\d", last
    ), done.stdout
    with psycopg.connect(server_url) as conn:
        left = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)).fetchall()
    assert left == [], "the benchmark's database is dropped afterwards"


def test_the_partitions_benchmark_removes_the_oldest_month_both_ways_and_prints_its_line(
    server_url: str,
) -> None:
    database = "followups_bench_partitions_smoke"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.partitions",
            "--rows",
            "12000",
            "--ops",
            "100",
            "--rounds",
            "1",
            "--window",
            "0.5",
            "--database",
            database,
        ],
        env=os.environ | {"DATABASE_URL": server_url},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    last = done.stdout.strip().splitlines()[-1]
    number = r"\d+(\.\d+)?"
    keys = [
        "delete_s",
        "drop_s",
        "delete_wal_mb",
        "drop_wal_mb",
        "delete_p99_ms",
        "drop_p99_ms",
        "baseline_p99_ms",
        "insert_ratio",
        "lookup_ratio",
    ]
    assert re.fullmatch("partitions: rows=12000" + "".join(f" {key}={number}" for key in keys), last), (
        done.stdout
    )
    with psycopg.connect(server_url) as conn:
        left = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchall()
    assert left == [], "the benchmark's database is dropped afterwards"


@pytest.mark.rabbitmq
def test_the_outbox_benchmark_relays_both_ways_and_prints_its_line(server_url: str, amqp_url: str) -> None:
    database = "followups_bench_outbox_smoke"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.outbox",
            "-n",
            "2000",
            "--aggregates",
            "200",
            "--before-events",
            "300",
            "--batch",
            "100",
            "--rounds",
            "1",
            "--database",
            database,
        ],
        env=os.environ | {"DATABASE_URL": server_url, "AMQP_URL": amqp_url},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    assert "each enrollment's in order" in done.stdout
    assert "backlog gauge honest in every run: yes" in done.stdout
    assert re.fullmatch(r"outbox: relayed_per_s=\d+ before_per_s=\d+ ratio=\d+\.\d\d", lines[-1]), done.stdout
    with psycopg.connect(server_url) as conn:
        left = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchall()
    assert left == [], "the benchmark's database is dropped afterwards"
