"""The goals race test's own role, run in a process of its own: `python -m tests.goals_race_roles URL STOP`.

Meets a goal (the contact's lead won) or an exit (the contact tagged ``gone``), in turn, for each contact in
a random order, through the ingress as the platform's events arrive; records when each had committed (wall
clock, after the commit) in race_goals. Stops when every contact had one, or when the file named by STOP
exists. The send lane is tests.race_roles's.
"""

from __future__ import annotations

import random
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import psycopg

from libs.common.contracts.platform_events import LeadStatusChanged
from libs.common.core.clock import SYSTEM_CLOCK
from libs.common.ingress import apply_event
from libs.common.ingress.contact_changes import change_tags


def goals(url: str, stop: Path) -> None:
    with psycopg.connect(url) as conn:
        project_id = conn.execute("SELECT id FROM projects LIMIT 1").fetchone()[0]  # type: ignore[index]
        leads = conn.execute("SELECT contact_id, id FROM leads ORDER BY contact_id").fetchall()
        conn.commit()
        random.shuffle(leads)
        for n, (contact_id, lead_id) in enumerate(leads):
            if stop.exists():
                return
            kind = "goal" if n % 2 == 0 else "exit"
            with conn.transaction():
                if kind == "goal":
                    event = LeadStatusChanged(lead_id=lead_id, status="won")
                    apply_event(conn, project_id, event, now=SYSTEM_CLOCK.now())
                else:
                    change_tags(conn, project_id, contact_id, add=["gone"], now=SYSTEM_CLOCK.now())
            committed = datetime.fromtimestamp(time.time(), UTC)
            with conn.transaction():
                conn.execute(
                    "INSERT INTO race_goals (contact_id, kind, committed_at) VALUES (%s, %s, %s)",
                    (contact_id, kind, committed),
                )


if __name__ == "__main__":
    goals(sys.argv[1], Path(sys.argv[2]))
