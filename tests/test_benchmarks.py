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
