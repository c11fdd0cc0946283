"""The release step's ceilings for `make bench-release`: the same statements without the product around them.

- **pgbench** (``ceiling_tps``): the release transaction of a one-step sequence as a pgbench script,
  generated from the release path's own named queries, run by W clients. Its client is C: nearly all of
  its CPU is the server's.
- **psycopg alone** (``driver_tps``): the same script's statements sent by W Python processes through
  psycopg's cursors, a transaction in one pipeline (:func:`~libs.common.core.db.pipelined_transaction`:
  the claim with its ``BEGIN``, the writes with the ``COMMIT``, two round trips), with no product code
  between them: no checks, rendering, events or metrics. What psycopg's cursors allow on this machine;
  the release path goes around them (:mod:`libs.common.core.queued`) and chains its steps (one round trip
  a step: :class:`libs.common.followups.release.Chain`), so it can pass this figure.

Each leg runs over a fresh seed of N due enrollments (:func:`benchmarks.seed.seed_due`).
"""

from __future__ import annotations

import multiprocessing
import os
import re
import shutil
import subprocess
import tempfile
import uuid
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import msgspec
import psycopg
from psycopg.rows import dict_row

from benchmarks.common import CpuUsed, cpu_ms_per, run_until_done
from benchmarks.seed import reset, seed_due
from libs.common.contracts.events import FINISHED, Event, MessageQueued, StepQueued
from libs.common.core.db import create_pool, pipelined_transaction
from libs.common.core.outbox import events_params
from libs.common.core.settings import DatabaseSettings
from libs.common.followups import release_state, transitions
from libs.common.followups.project_settings import DEFAULTS

#: Parameters that are constants in a one-step release (the release path binds the same values).
_CONSTANTS = {
    "now": "now()",
    "occurred_at": "now()",
    "source": "'followup'",
    "priority": "5",
    "body": "('Hello ' || :name::text)",  # the seed's step, "Hello {{contact.name}}", as rendered
    "media_url": "NULL",
    "media_kind": "NULL",
    "outcome": "'queued'",
    "reason": "NULL",
    "run_reason": "NULL",
    "data": "'{}'::jsonb",
    "followup_step_index": "0",
    "default_recipient_gap": str(DEFAULTS.min_recipient_gap_seconds),
    "sequence_version": "1",
    "campaign_id": "NULL",
    "rule_id": "NULL",
    "rule_execution_id": "NULL",
    "values": "NULL",
}

#: The types of the values carried from one statement's results to the next (pgbench passes text).
_TYPES = {
    "id": "uuid",
    "project_id": "uuid",
    "sequence_id": "uuid",
    "contact_id": "uuid",
    "conversation_id": "uuid",
    "number_id": "uuid",
    "message_id": "uuid",
    "last_message_id": "uuid",
    "enrolled_at": "timestamptz",
    "last_step_at": "timestamptz",
    "next_run_at": "timestamptz",
}


def _pgbench_statement(sql: str, gset: bool = False, **overrides: str) -> str:
    """``sql`` with each ``%(name)s`` replaced by a constant, an override, or a variable set by \\gset."""

    def substitute(match: re.Match[str]) -> str:
        name = match.group(1)
        if name in overrides:
            return overrides[name]
        if name in _CONSTANTS:
            return _CONSTANTS[name]
        return f"NULLIF(:{name}, '')::{_TYPES[name]}"

    body = re.sub(r"%\((\w+)\)s", substitute, sql)
    body = re.sub(r"--[^\n]*", "", body)  # a comment at a line's end would swallow the rest once joined
    body = " ".join(line.strip() for line in body.splitlines() if line.strip())
    return body + (" \\gset" if gset else ";")


#: Stand-in ids of the sample events, each spliced with the pgbench variable that holds the real one.
_STAND_INS = {
    uuid.UUID(int=1): "message_id",
    uuid.UUID(int=2): "id",
    uuid.UUID(int=3): "contact_id",
    uuid.UUID(int=4): "sequence_id",
    uuid.UUID(int=5): "open_conversation_id",
}
_SAMPLE_AT = datetime(2026, 1, 1, tzinfo=UTC)

#: The events a one-step release writes (the message queued, the step queued, the enrollment completed),
#: as the release path makes them, with the stand-in ids.
_SAMPLE_EVENTS: list[Event] = [
    MessageQueued(
        message_id=uuid.UUID(int=1),
        conversation_id=uuid.UUID(int=5),
        contact_id=uuid.UUID(int=3),
        number_id=None,
        source="followup",
        priority=5,
        followup_enrollment_id=uuid.UUID(int=2),
    ),
    StepQueued(
        enrollment_id=uuid.UUID(int=2),
        sequence_id=uuid.UUID(int=4),
        contact_id=uuid.UUID(int=3),
        step_index=0,
        message_id=uuid.UUID(int=1),
        reason=None,
    ),
    FINISHED["completed"](
        enrollment_id=uuid.UUID(int=2), sequence_id=uuid.UUID(int=4), contact_id=uuid.UUID(int=3), reason=None
    ),
]


def _written(text: str) -> str:
    """A JSON text the release path sends as a parameter, as a pgbench expression: the text, with each
    stand-in id spliced from the variable holding the real one, so that the server builds and parses the
    same document at each transaction and writes the same bytes."""
    # a space after each key (stored the same in jsonb): pgbench would take ``:null`` for a variable
    literal = "'" + text.replace('":', '": ').replace("'", "''") + "'"
    for stand_in, variable in _STAND_INS.items():
        literal = literal.replace(str(stand_in), f"' || :{variable}::text || '")
    return f"({literal})"


def pgbench_script() -> str:
    """The release transaction of a one-step sequence as a pgbench script, from the release path's SQL.

    Like the release path, it claims and reads the contact's state in one statement (which locks the
    conversation the message threads into), then sends every write and the COMMIT in one pipeline. The
    message id the release path makes in Python comes from that read here. pgbench cannot read a result
    inside a pipeline (``\\gset``), so its ``BEGIN`` costs a round trip of its own, where the release path
    sends it with the claim.
    """
    enrollment = "NULLIF(:id, '')::uuid"
    message = "NULLIF(:message_id, '')::uuid"
    conversation = "NULLIF(:open_conversation_id, '')::uuid"
    # the claim and the state in one statement, as the release path reads them
    fused = release_state.CLAIM_WITH_STATE.named
    claimed = fused.replace("SELECT e.*", "SELECT gen_random_uuid() AS message_id, e.*", 1)
    assert claimed != fused
    statements = [
        "BEGIN;",
        _pgbench_statement(claimed, gset=True),
        "\\startpipeline",
        _pgbench_statement(
            transitions.FINISH_STEP_QUEUED,  # the message's writes and the move, as the release path
            followup_enrollment_id=enrollment,
            template_name="NULL",
            template_language="NULL",
            template_parameters="NULL",
            month="date_trunc('month', now())::date",
            shard="floor(random() * 8)::smallint",
            activity_kind="'followup_sent'",
            activity=_written(msgspec.json.encode(_SAMPLE_EVENTS[1]).decode()),  # the step's, as its activity
            enrollment_id=enrollment,
            run_step="0",
            due_at="NULLIF(:next_run_at, '')::timestamptz",
            status="'completed'",
            note="NULL",
            step_index="1",
            message_id=message,
            conversation_id=conversation,
            events=_written(
                events_params(uuid.UUID(int=0), _SAMPLE_EVENTS, occurred_at=_SAMPLE_AT)["events"]
            ),
        ),
        "COMMIT;",
        "\\endpipeline",
    ]
    return "\n".join(statements) + "\n"


def run_ceiling(url: str, count: int, clients: int) -> float:
    """pgbench over the same statements: transactions per second."""
    return _pgbench(url, count, clients, pgbench_script())[0]


def statement_costs(url: str, count: int, clients: int) -> list[tuple[float, str]]:
    """The release transaction's statements one at a time (no pipeline), each with its mean latency (ms)
    as pgbench reports it: where the step's time in PostgreSQL goes (with one client: each statement's own
    cost and a round trip, no waiting on another transaction)."""
    script = pgbench_script().replace("\\startpipeline\n", "").replace("\\endpipeline\n", "")
    report = _pgbench(url, count, clients, script, per_statement=True)[1]
    costs = []
    for line in report.splitlines():
        match = re.match(r"\s+([\d.]+)\s+\d+\s+(\S.*)$", line) or re.match(r"\s+([\d.]+)\s+(\S.*)$", line)
        if match and not match.group(2).startswith("\\"):
            costs.append((float(match.group(1)), match.group(2)))
    return costs


def _pgbench(
    url: str, count: int, clients: int, script_text: str, *, per_statement: bool = False
) -> tuple[float, str]:
    """pgbench runs ``script_text`` ``count`` times over ``clients`` over a fresh seed of ``count``
    enrollments: (tps, pgbench's report)."""
    pgbench = shutil.which("pgbench")
    if pgbench is None:
        raise SystemExit("pgbench is needed for the ceiling (Debian: postgresql-client)")
    reset(url)
    seed_due(url, count)
    with psycopg.connect(url) as conn:
        project = conn.execute("SELECT id FROM projects").fetchone()
    assert project is not None
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as script:
        script.write(script_text)
    parts = urlsplit(url)
    env = os.environ | {"PGPASSWORD": parts.password or ""}
    result = subprocess.run(
        [
            pgbench,
            "-n",
            *(["-r"] if per_statement else []),
            "-M",
            "prepared",
            "-c",
            str(clients),
            "-j",
            str(clients),
            "-t",
            str(count // clients),
            "-f",
            script.name,
            "-D",
            f"project_id={project[0]}",
            url,  # the whole URL: a server on a socket (the embedded one's ?host=) too
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    os.unlink(script.name)
    match = re.search(r"tps = ([\d.]+)", result.stdout)
    if result.returncode != 0 or match is None or "failed transactions: 0 " not in result.stdout:
        raise SystemExit(f"pgbench failed:\n{result.stdout}\n{result.stderr}")
    return float(match.group(1)), result.stdout


# --- psycopg alone --------------------------------------------------------------------------------------


def driver_statements() -> tuple[str, str]:
    """The pgbench script's two round trips as psycopg statements: the claim with the contact's state, and
    the writes. pgbench's variables (``:name``) become named parameters, given as text as pgbench gives
    them."""
    lines = pgbench_script().splitlines()
    claim = next(line for line in lines if line.endswith(" \\gset")).removesuffix(" \\gset")
    writes = lines[lines.index("\\startpipeline") + 1 : lines.index("COMMIT;")]
    assert len(writes) == 1, writes  # one statement: the message's writes and the move
    return _named(claim), _named(writes[0].removesuffix(";"))


def _named(statement: str) -> str:
    """``statement`` with pgbench's ``:name`` as psycopg's ``%(name)s`` (a cast's ``::`` is kept)."""
    return re.sub(_VARIABLE, r"%(\1)s", statement.replace("%", "%%"))


#: A pgbench variable of the script (not a cast's ``::``, nor a ``:`` inside the JSON it writes).
_VARIABLE = re.compile(
    rf"(?<![:\w]):({'|'.join(sorted({*_TYPES, 'open_conversation_id', 'name'}, key=len, reverse=True))})\b"
)


def _driver_worker(url: str, project_id: str, ready: Any, go: Any, cpu: Any) -> None:
    """Claim and write through psycopg until nothing is due; leaves its CPU seconds and its backend's in
    ``cpu`` (-1: the backend is not on this machine)."""
    claim, write = driver_statements()
    names = set(re.findall(r"%\((\w+)\)s", write)) - {"project_id"}
    pool = create_pool(DatabaseSettings(url=url, pool_min_size=1, pool_max_size=1))
    used = CpuUsed(pool)
    ready.release()
    go.wait()
    used.start()
    with pool.connection() as conn:
        while True:
            with pipelined_transaction(conn):
                cursor = conn.cursor(row_factory=dict_row)
                row = cursor.execute(claim, {"project_id": project_id}).fetchone()
                if row is None:
                    break
                params = {name: "" if row[name] is None else str(row[name]) for name in names}
                conn.execute(write, params | {"project_id": project_id})
    cpu[0], cpu[1] = used.seconds()
    pool.close()


def run_driver(url: str, count: int, clients: int) -> tuple[float, float, float | None]:
    """The same statements through psycopg alone, ``clients`` processes over a fresh seed of ``count``:
    (transactions/s, the clients' CPU ms a transaction, their backends' (None: not on this machine))."""
    reset(url)
    seed_due(url, count)
    with psycopg.connect(url) as conn:
        project = conn.execute("SELECT id FROM projects").fetchone()
    assert project is not None and isinstance(project[0], uuid.UUID)
    context = multiprocessing.get_context("spawn")
    ready, go = context.Semaphore(0), context.Event()
    cpus = [context.Array("d", 2) for _ in range(clients)]
    processes = [
        context.Process(target=_driver_worker, args=(url, str(project[0]), ready, go, cpu)) for cpu in cpus
    ]
    elapsed = run_until_done(processes, ready, go)
    with psycopg.connect(url) as conn:
        ran = conn.execute("SELECT count(*) FROM followup_step_runs").fetchone()
    assert ran is not None and ran[0] == count, f"psycopg alone ran {ran} of {count}"
    return (count / elapsed, *cpu_ms_per(cpus, count))
