"""The benchmarks keep working as the code under them changes: a small run of the release benchmark's
backlog part, through its command line, prints its line with its keys (figures are not judged here:
performance is measured by running the benchmarks, never by tests)."""

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
