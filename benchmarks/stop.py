"""`make bench-stop`: stop-path latency for a contact with live follow-ups, with 10,000 and with
1,000,000 enrollments in the table.

Each sample is a reply's stop path in its own transaction: lock the contact, the ONE indexed
``UPDATE ... RETURNING`` over its live enrollments, and the cancellation of its follow-up messages
still QUEUED (each sampled contact has two live enrollments and one QUEUED follow-up). The latency is
measured inside the transaction (the commit, a disk flush on the server, is printed separately).

The last line is `stop: p99_ms_10k=<n> p99_ms_1m=<n>`.
"""

from __future__ import annotations

import argparse
import random
import time
import uuid
from datetime import UTC, datetime

import psycopg

from benchmarks.common import bench_database, percentile
from benchmarks.seed import seed_project
from libs.common.followups.stops import stop_followups_for_contact
from libs.common.platform.contacts import lock_contact

BENCH_DATABASE = "followups_bench_stop"

#: Enrollments per contact in the seeded table; each sampled contact has 2 live ones.
PER_CONTACT = 4


def seed(url: str, enrollments: int) -> tuple[uuid.UUID, list[uuid.UUID]]:
    """``enrollments`` rows over enrollments/PER_CONTACT contacts, most finished; returns sample contacts."""
    contacts = enrollments // PER_CONTACT
    now = datetime.now(UTC)
    with psycopg.connect(url) as conn:
        project_id, sequence_id = seed_project(conn)
        version_id = conn.execute(
            "SELECT current_version_id FROM followup_sequences WHERE id = %s", (sequence_id,)
        ).fetchone()[0]  # type: ignore[index]
        params = {"p": project_id, "v": version_id, "n": contacts, "now": now}
        conn.execute(
            "INSERT INTO contacts (project_id, phone) SELECT %(p)s, '+1' || (3000000000 + g)::text"
            " FROM generate_series(1, %(n)s) g",
            params,
        )
        # one-off enrollments (sequence_id NULL): PER_CONTACT per contact, the first two live, the rest done
        conn.execute(
            f"""
            INSERT INTO followup_enrollments (project_id, version_id, contact_id, status, next_run_at,
                                              enrolled_at, updated_at, finished_at)
            SELECT %(p)s, %(v)s, c.id, CASE WHEN k <= 2 THEN 'active' ELSE 'completed' END,
                   %(now)s + interval '1 day', %(now)s, %(now)s, CASE WHEN k > 2 THEN %(now)s END
            FROM contacts c, generate_series(1, {PER_CONTACT}) k
            WHERE c.project_id = %(p)s
            """,
            params,
        )
        sample = [row[0] for row in conn.execute("SELECT id FROM contacts ORDER BY random() LIMIT 500")]
        # one QUEUED follow-up per sampled contact, for the cancellation
        conn.execute(
            """
            INSERT INTO messages (project_id, contact_id, direction, status, source, body,
                                  followup_enrollment_id, followup_step_index)
            SELECT DISTINCT ON (e.contact_id)
                   %(p)s, e.contact_id, 'outbound', 'QUEUED', 'followup', 'hi', e.id, 0
            FROM followup_enrollments e WHERE e.contact_id = ANY(%(sample)s) AND e.status = 'active'
            """,
            params | {"sample": sample},
        )
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
    return project_id, sample


def measure(url: str, project_id: uuid.UUID, contacts: list[uuid.UUID]) -> tuple[list[float], list[float]]:
    """Stop-path latencies (ms) inside the transaction, and with the commit."""
    inside, with_commit = [], []
    with psycopg.connect(url) as conn:
        for contact_id in contacts:
            started = time.perf_counter()
            lock_contact(conn, project_id, contact_id)  # as a reply locks it: by its project's key
            stopped = stop_followups_for_contact(conn, project_id, contact_id, "reply", now=datetime.now(UTC))
            inside.append((time.perf_counter() - started) * 1000)
            conn.commit()
            with_commit.append((time.perf_counter() - started) * 1000)
            assert len(stopped.enrollment_ids) == 2 and len(stopped.cancelled_message_ids) == 1
    return inside, with_commit


def run(enrollments: int) -> float:
    with bench_database(BENCH_DATABASE) as url:
        project_id, sample = seed(url, enrollments)
        random.shuffle(sample)
        measure(url, project_id, sample[:50])  # warm-up: caches, prepared statements
        inside, with_commit = measure(url, project_id, sample[50:])
    p50, p99 = percentile(inside, 50), percentile(inside, 99)
    print(
        f"  {enrollments:>9,} enrollments: stop path p50 {p50:.2f} ms, p99 {p99:.2f} ms"
        f" (with commit: p50 {percentile(with_commit, 50):.2f} ms, p99 {percentile(with_commit, 99):.2f} ms)"
    )
    return p99


def main() -> None:
    parser = argparse.ArgumentParser(description="stop-path latency at 10k and 1M enrollments")
    parser.add_argument("--small", type=int, default=10_000)
    parser.add_argument("--large", type=int, default=1_000_000)
    args = parser.parse_args()
    print("stop benchmark: a reply's stop path for a contact with 2 live enrollments and 1 queued follow-up")
    small = run(args.small)
    large = run(args.large)
    print(f"stop: p99_ms_10k={small:.2f} p99_ms_1m={large:.2f}")


if __name__ == "__main__":
    main()
