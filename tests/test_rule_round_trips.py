"""A trigger's actions go out with its first round trip: what an action only checks of its writes (a
contact's tags, a conversation's change once locked) is read once every statement of the trigger's first
round trip was answered; a write that fails there is found at the end, and the rules then run again one by
one, as when an action fails at once."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import psycopg
import pytest
from litestar.testing import TestClient
from psycopg.pq import Trace

from libs.common.core.db import create_pool
from libs.common.core.runtime import Runtime
from libs.common.core.settings import DatabaseSettings
from libs.common.rules.actions import AssignTeam
from libs.common.rules.triggers import process_triggers
from tests.rule_helpers import add_tag, create_rule
from tests.rule_trigger_helpers import new_contact, runs, tags_of


def _bursts(trace: str) -> list[str]:
    """What the client sent between two answers of the server, each burst as one text (libpq's trace: a line
    of the client's starts with F, one of the server's with B; a statement's text may go on over lines)."""
    bursts: list[str] = []
    sending = False
    for line in trace.splitlines():
        if line.startswith("F\t") and not sending:
            bursts.append("")
            sending = True
        elif line.startswith("B\t"):
            sending = False
        if sending:
            bursts[-1] += line + "\n"
    return bursts


def test_a_tag_action_goes_out_with_the_lease_s_lock_and_the_runs(
    client: TestClient[Any], runtime: Runtime
) -> None:
    rule = create_rule(client, "contact.created", [add_tag("first-trip")])
    contact = new_contact(client)
    pool = create_pool(DatabaseSettings(url=runtime.settings.database.url, pool_min_size=1, pool_max_size=1))
    try:
        with tempfile.TemporaryFile("w+") as trace:
            with pool.connection() as conn:  # the pool's one connection, traced from here on
                conn.pgconn.trace(trace.fileno())
                conn.pgconn.set_trace_flags(Trace.SUPPRESS_TIMESTAMPS)
            assert process_triggers(pool, runtime.clock).triggers == 1
            with pool.connection() as conn:
                conn.pgconn.untrace()
            os.fsync(trace.fileno())
            trace.seek(0)
            bursts = _bursts(trace.read())
    finally:
        pool.close()

    [first] = [burst for burst in bursts if 'SAVEPOINT "rules"' in burst]
    assert "SELECT id FROM followup_triggers" in first and "INSERT INTO rule_runs" in first, first
    assert "UPDATE contacts SET" in first, first  # the action's write, in the same burst
    assert runs(client, rule) == [("executed", None)]
    assert tags_of(client, contact) == {"first-trip"}


def test_a_write_that_fails_at_the_end_runs_the_rules_again_one_by_one(
    client: TestClient[Any], runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unread_failure(self: AssignTeam, conn: psycopg.Connection[Any], *args: Any) -> None:
        conn.execute("SELECT 1 / 0")  # not read: the error comes back with the trigger's first round trip

    monkeypatch.setattr(AssignTeam, "run", unread_failure)
    kept = create_rule(client, "contact.created", [add_tag("kept")])
    failing = create_rule(client, "contact.created", [{"type": "assign_team", "team": "sales"}])
    contact = new_contact(client)

    assert process_triggers(runtime.pool, runtime.clock).triggers == 1

    assert runs(client, kept) == [("executed", None)]
    assert runs(client, failing) == []
    assert tags_of(client, contact) == {"kept"}
    with runtime.pool.connection() as conn:
        [(attempts, processed_at, error)] = conn.execute(
            "SELECT attempts, processed_at, last_error FROM followup_triggers"
        ).fetchall()
    assert (attempts, processed_at) == (1, None)
    assert "division by zero" in error and failing in error
