"""Roles for the race test, each run in a process of its own: `python -m tests.race_roles ROLE URL ...`.

send_lane  claims QUEUED messages as fast as it can and reports them SENT; records when each claim
           started (wall clock, before the claim statement) in race_claims
replier    applies inbound messages (replies) for random contacts; records when each reply had
           committed (wall clock, after the commit) in race_replies
Both stop when the file named by STOP exists.
"""

from __future__ import annotations

import random
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import psycopg

from libs.common.contracts.platform_events import InboundMessage, MessageStatus
from libs.common.core.clock import SYSTEM_CLOCK
from libs.common.ingress import apply_event
from libs.common.platform.send_lane import ClaimRequest, claim_messages


def _wall() -> datetime:
    return datetime.fromtimestamp(time.time(), UTC)


def send_lane(url: str, stop: Path) -> None:
    with psycopg.connect(url) as conn:
        project_id = conn.execute("SELECT id FROM projects LIMIT 1").fetchone()[0]  # type: ignore[index]
        conn.commit()
        while not stop.exists():
            started = _wall()
            with conn.transaction():
                claimed = claim_messages(conn, project_id, ClaimRequest(limit=20), now=SYSTEM_CLOCK.now())
            if not claimed:
                # pacing, not a wait for a result: a send lane with nothing to claim polls again shortly
                time.sleep(0.005)
                continue
            with conn.transaction():
                conn.cursor().executemany(
                    "INSERT INTO race_claims (message_id, claim_started_at) VALUES (%s, %s)",
                    [(m.id, started) for m in claimed],
                )
                for message in claimed:
                    apply_event(
                        conn,
                        project_id,
                        MessageStatus(message_id=message.id, status="SENT"),
                        now=SYSTEM_CLOCK.now(),
                    )


def replier(url: str, stop: Path) -> None:
    with psycopg.connect(url) as conn:
        project_id = conn.execute("SELECT id FROM projects LIMIT 1").fetchone()[0]  # type: ignore[index]
        contacts = [row[0] for row in conn.execute("SELECT id FROM contacts")]
        conn.commit()
        while not stop.exists():
            contact_id = random.choice(contacts)
            with conn.transaction():
                event = InboundMessage(
                    contact_id=contact_id, provider_message_id=f"race-{uuid.uuid4()}", body="hi"
                )
                apply_event(conn, project_id, event, now=SYSTEM_CLOCK.now())
            committed = _wall()
            with conn.transaction():
                conn.execute(
                    "INSERT INTO race_replies (contact_id, committed_at) VALUES (%s, %s)",
                    (contact_id, committed),
                )


if __name__ == "__main__":
    role, url, stop_file = sys.argv[1:4]
    {"send_lane": send_lane, "replier": replier}[role](url, Path(stop_file))
