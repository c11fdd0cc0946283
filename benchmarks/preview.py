"""`make bench-preview`: the latency of a sequence's time-travel preview (``POST /v1/sequences/{id}/preview``
without HTTP: :func:`libs.common.followups.preview.preview` in its own transaction), for a sequence of 5 steps
and one of 50 (the most a sequence has), in a project with 10,000 live enrollments.

Each step of the 5-step sequence meets something the release path applies: the project's send window
(09:00-17:00 on weekdays, in the contact's zone), a cap of one follow-up a day, a missing variable, an AI
step's fallback; the 50-step one is its steps repeated. Each sample previews a different contact (the
preview enrolls it and releases every step in a savepoint it rolls back); the latency includes the rollback
and the commit of the empty transaction.

The last line is `preview: p50_ms_5=<n> p99_ms_5=<n> p50_ms_50=<n> p99_ms_50=<n>`.
"""

from __future__ import annotations

import argparse
import time
import uuid
from datetime import UTC, datetime, timedelta

import psycopg

from benchmarks.common import bench_database, percentile
from benchmarks.seed import seed_due_enrollments, seed_project
from libs.common.core.settings import FollowupSettings
from libs.common.followups.definition import AiStep, Definition, MessageStep, Node, Step, TemplateFallback
from libs.common.followups.preview import PreviewRequest, preview
from libs.common.followups.project_settings import ProjectSettings, put_settings
from libs.common.followups.send_window import SendWindow
from libs.common.followups.sequences import SequenceCreate, create_sequence, publish_sequence

BENCH_DATABASE = "followups_bench_preview"
SETTINGS = FollowupSettings()
#: A Monday, 08:00 UTC: before the window opens in New York.
START = datetime(2030, 1, 7, 8, 0, tzinfo=UTC)

#: The five steps, each meeting a constraint of the release path.
STEPS: list[Step] = [
    MessageStep(text="Hi {{contact.name}}, welcome to the {{vars.plan}} plan"),
    MessageStep(text="Any questions about {{vars.plan}}?", delay_seconds=3600),
    MessageStep(text="Your code: {{vars.code}}", delay_seconds=60),
    AiStep(
        instructions="Ask how the trial went",
        fallback=TemplateFallback(text="How did the trial go, {{contact.name}}?"),
        delay_seconds=3600,
    ),
    MessageStep(text="Last one, {{contact.name}}", delay_seconds=86400),
]


def seed(url: str, live: int) -> tuple[uuid.UUID, dict[int, uuid.UUID], list[uuid.UUID]]:
    """A project with ``live`` active enrollments (due in a day), its settings, and the 5- and 50-step
    sequences; returns the project, the sequences by length, and the contacts to preview (not enrolled)."""
    with psycopg.connect(url) as conn:
        project_id, base = seed_project(conn)
        seed_due_enrollments(conn, project_id, base, live, due_at=START + timedelta(days=1))
        window = SendWindow(start="09:00", end="17:00", days=["mon", "tue", "wed", "thu", "fri"])
        settings = ProjectSettings(send_window=window, max_per_contact_24h=1)
        put_settings(conn, project_id, settings, now=START, ai_token_cap=None)
        sequences = {}
        for length in (5, 50):
            steps: list[Node] = [STEPS[i % len(STEPS)] for i in range(length)]
            created = create_sequence(
                conn, project_id, SequenceCreate(name=f"preview {length}", definition=Definition(steps=steps))
            )
            publish_sequence(conn, project_id, created.id)
            sequences[length] = created.id
        conn.execute(
            "INSERT INTO contacts (project_id, phone, name, timezone)"
            " SELECT %s, '+1' || (4000000000 + g)::text, 'Preview ' || g, 'America/New_York'"
            " FROM generate_series(1, 2000) g",
            (project_id,),
        )
        contacts = [
            row[0]
            for row in conn.execute(
                "SELECT id FROM contacts WHERE project_id = %s AND name LIKE 'Preview %%' ORDER BY id",
                (project_id,),
            )
        ]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
    return project_id, sequences, contacts


def measure(
    url: str, project_id: uuid.UUID, sequence_id: uuid.UUID, contacts: list[uuid.UUID]
) -> list[float]:
    """Each contact's preview latency (ms), its transaction included."""
    samples = []
    with psycopg.connect(url) as conn:
        for contact_id in contacts:
            started = time.perf_counter()
            answer = preview(
                conn,
                project_id,
                sequence_id,
                PreviewRequest(contact_id=contact_id, variables={"plan": "gold"}),
                SETTINGS,
                now=START,
            )
            conn.commit()
            samples.append((time.perf_counter() - started) * 1000)
            assert answer.complete and answer.rejected is None, answer
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description="a sequence preview's latency, 5 and 50 steps")
    parser.add_argument("-n", "--samples", type=int, default=300, help="previews of each sequence")
    parser.add_argument("--live", type=int, default=10_000, help="live enrollments in the project")
    parser.add_argument("--database", default=BENCH_DATABASE)
    args = parser.parse_args()
    print(
        f"preview benchmark: {args.samples} previews of a 5-step and of a 50-step sequence,"
        f" {args.live:,} live enrollments"
    )
    figures = {}
    with bench_database(args.database) as url:
        project_id, sequences, contacts = seed(url, args.live)
        warm, rest = contacts[:20], contacts[20:]
        for length, sequence_id in sequences.items():
            measure(url, project_id, sequence_id, warm)  # warm-up: caches, the version cache, plans
            samples = measure(url, project_id, sequence_id, rest[: args.samples])
            figures[length] = (percentile(samples, 50), percentile(samples, 99))
            print(f"  {length:>2} steps: p50 {figures[length][0]:.1f} ms, p99 {figures[length][1]:.1f} ms")
    (p50_5, p99_5), (p50_50, p99_50) = figures[5], figures[50]
    print(f"preview: p50_ms_5={p50_5:.1f} p99_ms_5={p99_5:.1f} p50_ms_50={p50_50:.1f} p99_ms_50={p99_50:.1f}")


if __name__ == "__main__":
    main()
