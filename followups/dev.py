"""``followups dev``: the embedded default, with nothing to install.

PostgreSQL runs through pgserver under a data folder that is reused across runs; the StubBroker carries
actor messages inside the process; every service's loops run here; the API listens on 127.0.0.1:8000.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import uuid
import warnings
from pathlib import Path

from followups.runner import SERVICES, start_services
from libs.common.core.broker import create_broker
from libs.common.core.clock import SYSTEM_CLOCK
from libs.common.core.db import create_pool
from libs.common.core.migrate import migrate
from libs.common.core.outbox import LogPublisher
from libs.common.core.runtime import Runtime
from libs.common.core.settings import DatabaseSettings, Settings
from libs.common.followups.definition import Definition, MessageStep
from libs.common.followups.enrollments import EnrollRequest, enroll
from libs.common.followups.sequences import SequenceCreate, create_sequence, publish_sequence
from libs.common.platform.contacts import ContactFields, upsert_contact
from libs.common.platform.projects import create_api_key, create_project

log = logging.getLogger("followups.dev")

DEMO_PHONES = ("+15550100001", "+15550100002", "+15550100003")


def start_embedded_postgres(data_dir: Path) -> tuple[object, str]:
    """Start (or reuse) the embedded PostgreSQL under ``data_dir``; returns the server and its URL."""
    import pgserver

    pgdata = (data_dir / "pgdata").resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    _forget_dead_handles(pgdata)
    with warnings.catch_warnings():
        # without XDG_RUNTIME_DIR platformdirs falls back to /tmp, which is fine here
        warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
        server = pgserver.get_server(str(pgdata), cleanup_mode="stop")
    return server, str(server.get_uri())


def _forget_dead_handles(pgdata: Path) -> None:
    """Drop processes that died without stopping the server from pgserver's list of its users.

    pgserver stops the server when its last user exits; a run that was killed stays on that list and
    would keep the server running forever after.
    """
    handles = pgdata / ".handle_pids.json"
    if not handles.exists():
        return
    try:
        pids = [int(pid) for pid in json.loads(handles.read_text())]
    except (ValueError, TypeError):
        pids = []
    handles.write_text(json.dumps([pid for pid in pids if _alive(pid)]))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run_dev(base: Settings, *, data_dir: str, host: str, port: int, demo: bool) -> int:
    import uvicorn

    from services.api.app import create_app

    folder = Path(data_dir)
    print(f"followups dev: embedded PostgreSQL under {folder.resolve() / 'pgdata'} (reused across runs)")
    server, url = start_embedded_postgres(folder)
    settings = dataclasses.replace(
        base, database=DatabaseSettings(url=url, pool_min_size=1, pool_max_size=10)
    )
    migrate(url)
    pool = create_pool(settings.database, name="followups-dev")
    runtime = Runtime(settings, pool, create_broker(settings.broker, embedded=True), SYSTEM_CLOCK)
    project_id, api_key = _dev_project(runtime, folder)
    if demo:
        _create_demo(runtime, project_id)
    running = start_services(runtime, sorted(SERVICES), LogPublisher())
    print(
        f"\n  API       http://{host}:{port}  (OpenAPI: http://{host}:{port}/schema)\n"
        f"  project   {project_id}\n"
        f"  API key   {api_key}\n\n"
        f"  try: curl -H 'Authorization: Bearer {api_key}' http://{host}:{port}/v1/contacts\n"
        "  Ctrl-C stops.\n",
        flush=True,
    )
    try:
        uvicorn.run(create_app(runtime), host=host, port=port, log_config=None)
    finally:
        running.stop()
        pool.close()
        server.cleanup()  # type: ignore[attr-defined]
    return 0


def _dev_project(runtime: Runtime, folder: Path) -> tuple[uuid.UUID, str]:
    """The dev project, created on the first run and reused; a fresh API key each run."""
    marker = folder / "project_id"
    with runtime.pool.connection() as conn:
        if marker.exists():
            project_id = uuid.UUID(marker.read_text().strip())
            if conn.execute("SELECT 1 FROM projects WHERE id = %s", (project_id,)).fetchone():
                return project_id, create_api_key(conn, project_id, name="dev")
        project = create_project(conn, "dev")
    marker.write_text(str(project.project_id))
    return project.project_id, project.api_key


def _create_demo(runtime: Runtime, project_id: uuid.UUID) -> None:
    """A three-step demo sequence (now, +20 s, +40 s) and a few demo contacts enrolled in it."""
    now = runtime.clock.now()
    definition = Definition(
        steps=[
            MessageStep(text="Hi! Thanks for your interest - any questions?", delay_seconds=0),
            MessageStep(text="Just checking in: shall we book a call?", delay_seconds=20),
            MessageStep(text="Last note from us - reply any time.", delay_seconds=40),
        ]
    )
    with runtime.pool.connection() as conn:
        sequence = create_sequence(
            conn, project_id, SequenceCreate(name=f"demo {now:%Y-%m-%d %H:%M:%S}", definition=definition)
        )
        publish_sequence(conn, project_id, sequence.id)
        for phone in DEMO_PHONES:
            contact, _ = upsert_contact(conn, project_id, phone, ContactFields(name=f"Demo {phone[-1]}"))
            enroll(
                conn,
                project_id,
                EnrollRequest(sequence_id=sequence.id, contact_id=contact.id),
                now=now,
                source="demo",
            )
    log.info("demo sequence created", extra={"sequence_id": str(sequence.id), "contacts": len(DEMO_PHONES)})
