"""The benchmarks keep working as the code under them changes: a small run of the release benchmark's
backlog, ratio (its pgbench ceiling and psycopg alone), scale and profile parts, of the partitions
benchmark, of the outbox benchmark and of the preview benchmark, through their command lines, print their
lines with their keys (figures are not judged here: performance is measured by running the benchmarks,
never by tests)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import psycopg
import pytest

pytestmark = pytest.mark.slow


def run_benchmark(server_url: str, module: str, database: str, *args: str, **env: str) -> str:
    """``benchmarks.<module>`` run with ``args`` in a database of its own: its output, once it exited 0 and
    dropped its database."""
    done = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{module}", *args, "--database", database],
        env=os.environ | {"DATABASE_URL": server_url} | env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    with psycopg.connect(server_url) as conn:
        left = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchall()
    assert left == [], "the benchmark's database is dropped afterwards"
    return done.stdout


def last_line(output: str) -> str:
    return output.strip().splitlines()[-1]


def test_the_release_benchmarks_backlog_part_drains_both_backlogs_and_prints_its_line(
    server_url: str,
) -> None:
    output = run_benchmark(
        server_url,
        "release",
        "followups_bench_smoke",
        *("--backlog-only", "--backlog-small", "1000", "--backlog-large", "2000", "--rounds", "2"),
    )
    assert re.fullmatch(
        r"release: steps_per_s_1k=\d+ steps_per_s_2k=\d+ backlog_ratio_2k_1k=\d+\.\d\d", last_line(output)
    ), output
    # the two backlogs drained in turn, round after round
    assert re.search(r"\(runs in turn: \d+/\d+ \d+/\d+\)", output), output


def test_the_release_benchmarks_ratio_runs_the_release_its_pgbench_ceiling_and_psycopg_alone_in_turn(
    server_url: str,
) -> None:
    # psycopg alone runs the pgbench script's statements: the run fails if one does not prepare or does not
    # finish every enrollment (its step runs are counted)
    output = run_benchmark(
        server_url,
        "release",
        "followups_bench_smoke_ratio",
        *("--ratio-only", "-n", "300", "-w", "1", "--rounds", "2"),
    )
    assert re.fullmatch(
        r"release: steps_per_s=\d+ ceiling_tps=\d+ ratio=\d+\.\d\d driver_tps=\d+ driver_ratio=\d+\.\d\d"
        r" worker_cpu_ms_per_step=\d+\.\d{3} backend_cpu_ms_per_step=\d+\.\d{3}",
        last_line(output),
    ), output
    assert re.search(r"runs in turn, release/psycopg alone/pgbench: \d+/\d+/\d+ \d+/\d+/\d+\)", output), (
        output
    )
    assert re.search(r"psycopg alone .*: \d+ tps; CPU a transaction: its clients \d+\.\d{3} ms", output), (
        output
    )


def test_the_release_benchmarks_scale_part_prints_the_claim_ratio_and_a_workers_rss_at_both_sizes(
    server_url: str,
) -> None:
    output = run_benchmark(
        server_url,
        "release",
        "followups_bench_smoke_scale",
        *(
            "--scale-only",
            "--claim-small",
            "1000",
            "--claim-large",
            "2000",
            "--scale-due",
            "50",
            "--rounds",
            "1",
        ),
    )
    assert re.fullmatch(
        r"release: claim_ratio_1m_10k=\d+\.\d\d rss_mb_1k=\d+\.\d rss_mb_2k=\d+\.\d"
        r" rss_ratio_2k_1k=\d+\.\d\d",
        last_line(output),
    ), output


def test_the_release_benchmarks_profile_names_the_release_path(server_url: str) -> None:
    output = run_benchmark(
        server_url, "release", "followups_bench_smoke_profile", *("--profile", "-n", "200", "-w", "1")
    )
    assert re.fullmatch(r"release: profiled_steps_per_s=\d+", last_line(output)), output
    assert "release_claimed" in output, output


def test_the_release_benchmarks_statements_part_runs_the_release_transaction_and_prints_its_line(
    server_url: str,
) -> None:
    # the pgbench script is the release path's own SQL: a parameter it does not give, or a comment that
    # swallows the rest of a joined statement, fails pgbench (and the ceiling of the whole run with it)
    output = run_benchmark(server_url, "release", "followups_bench_statements", "--statements", "-n", "50")
    assert re.fullmatch(r"release: statements=\d+ statement_ms_total=\d+\.\d{3}", last_line(output)), output
    # BEGIN, the claim with the contact's state, the message's writes with the move, COMMIT
    assert "release: statements=4 " in last_line(output) and "INSERT INTO messages" in output, output


def test_the_partitions_benchmark_removes_the_oldest_month_both_ways_and_prints_its_line(
    server_url: str,
) -> None:
    output = run_benchmark(
        server_url,
        "partitions",
        "followups_bench_partitions_smoke",
        *("--rows", "12000", "--ops", "100", "--rounds", "1", "--window", "0.5"),
    )
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
    expected = "partitions: rows=12000" + "".join(f" {key}={number}" for key in keys)
    assert re.fullmatch(expected, last_line(output)), output


@pytest.mark.rabbitmq
def test_the_outbox_benchmark_relays_both_ways_and_prints_its_line(server_url: str, amqp_url: str) -> None:
    output = run_benchmark(
        server_url,
        "outbox",
        "followups_bench_outbox_smoke",
        *("-n", "2000", "--aggregates", "200", "--before-events", "300", "--batch", "100", "--rounds", "1"),
        AMQP_URL=amqp_url,
    )
    assert "each enrollment's in order" in output
    assert "backlog gauge honest in every run: yes" in output
    assert re.fullmatch(r"outbox: relayed_per_s=\d+ before_per_s=\d+ ratio=\d+\.\d\d", last_line(output)), (
        output
    )


def test_the_preview_benchmark_previews_both_sequences_and_prints_its_line(server_url: str) -> None:
    output = run_benchmark(
        server_url, "preview", "followups_bench_preview_smoke", *("--samples", "3", "--live", "100")
    )
    number = r"\d+\.\d"
    assert re.fullmatch(
        rf"preview: p50_ms_5={number} p99_ms_5={number} p50_ms_50={number} p99_ms_50={number}",
        last_line(output),
    ), output
