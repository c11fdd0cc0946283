"""``followups dev``: the embedded default, with nothing to install.

PostgreSQL runs through pgserver under a data folder that is reused across runs; the StubBroker carries
actor messages inside the process; every service's loops run here; the API listens on API_HOST:API_PORT
(127.0.0.1:8000 unless told otherwise).

The data folder keeps, besides the database (``pgdata/``), the dev project's id (``project_id``) and its
API key in clear (``api_key``, readable by its owner only): the database stores keys only hashed, so the
file is what lets every run print the same key. A project is created only when the folder has none.

With ``--fake-provider`` the fake WhatsApp Cloud API runs in the process and the dev number sends through
it (:mod:`followups.dev_provider`): the log shows what reached the phone, and its statuses come back
through the webhook.

With ``--local-model`` a real model writes the AI steps: llama.cpp's server with SmolLM2-135M
(:mod:`followups.local_model`, the ``local-model`` extra) runs as a child process on a free port until dev
stops, and ``AI_BASE_URL`` points at it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import sys
import threading
import uuid
import warnings
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
from psycopg import Connection

from followups import local_model as local
from followups.dev_provider import DEV_ACCESS_TOKEN, DEV_APP_SECRET, report_to, wire_dev_number
from followups.fake_providers import fake_graph
from followups.runner import SERVICES, serve_metrics, start_services
from libs.common.core.broker import create_broker
from libs.common.core.clock import SYSTEM_CLOCK
from libs.common.core.db import create_pool
from libs.common.core.errors import Unauthorized
from libs.common.core.migrate import migrate
from libs.common.core.outbox import LogPublisher
from libs.common.core.runtime import Runtime
from libs.common.core.settings import Settings
from libs.common.followups.definition import Definition, MessageStep
from libs.common.followups.enrollments import EnrollRequest, enroll
from libs.common.followups.sequences import SequenceCreate, create_sequence, publish_sequence
from libs.common.platform.api_keys import ApiKeyCreate, authenticate, create_key
from libs.common.platform.contacts import ContactFields, upsert_contact
from libs.common.platform.projects import create_project

if TYPE_CHECKING:
    import uvicorn

log = logging.getLogger("followups.dev")

#: The data folder when ``--data-dir`` is not given.
DEFAULT_DATA_DIR = ".followups"

#: Files of the data folder: the database, the dev project's id, and its API key (mode 0600).
PGDATA, PROJECT_FILE, KEY_FILE = "pgdata", "project_id", "api_key"

DEMO_PHONES = ("+15550100001", "+15550100002", "+15550100003")


class NoEmbeddedDatabase(Exception):
    """There is no embedded database under this data folder."""


@dataclasses.dataclass(frozen=True)
class DevProject:
    project_id: uuid.UUID
    api_key: str
    created: bool
    new_key: bool


def start_embedded_postgres(data_dir: Path) -> tuple[Any, str]:
    """Start (or join) the embedded PostgreSQL under ``data_dir``; returns the server and its URL."""
    pgdata = (data_dir / PGDATA).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    _forget_dead_handles(pgdata)
    with warnings.catch_warnings():
        # pgserver asks platformdirs for a runtime folder when it is imported (a class attribute) and
        # platformdirs warns that without XDG_RUNTIME_DIR it falls back to /tmp/runtime-<uid>, which is
        # fine here: pgserver only keeps a lock file there, and a socket when the data path is too long.
        warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
        import pgserver

        server = pgserver.get_server(str(pgdata), cleanup_mode="stop")
    return server, str(server.get_uri())


@contextlib.contextmanager
def embedded_database(data_dir: Path) -> Iterator[str]:
    """The URL of the (migrated) embedded database of an existing data folder, started if no ``followups
    dev`` runs on it; stopped again afterwards unless one does."""
    if not (data_dir / PGDATA / "PG_VERSION").exists():
        raise NoEmbeddedDatabase(
            f"no embedded database under {data_dir.resolve()}"
            f" (`followups dev --data-dir {data_dir}` creates it)"
        )
    server, url = start_embedded_postgres(data_dir)
    try:
        migrate(url)
        yield url
    finally:
        server.cleanup()


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


def run_dev(
    base: Settings,
    *,
    data_dir: str,
    host: str,
    port: int,
    demo: bool,
    local_model: bool = False,
    fake_provider: bool = False,
) -> int:
    with contextlib.ExitStack() as stack:
        wire: Wire | None = None
        if fake_provider:
            graph = stack.enter_context(fake_graph(DEV_ACCESS_TOKEN, DEV_APP_SECRET))
            print(f"followups dev: fake WhatsApp Cloud API at {graph.graph_url}", flush=True)
            channels = msgspec.structs.replace(base.channels, whatsapp_graph_url=graph.graph_url)
            base = dataclasses.replace(base, channels=channels)
            api = f"http://{host}:{port}"

            def wire(runtime: Runtime, project_id: uuid.UUID) -> None:
                report_to(graph, api, wire_dev_number(runtime, project_id))

        if not local_model:
            return _run_dev(base, data_dir=data_dir, host=host, port=port, demo=demo, model=None, wire=wire)
        problem = local.missing()
        if problem is not None:
            print(f"followups dev: --local-model: {problem}", file=sys.stderr)
            return 2
        print("followups dev: starting the local model (llama.cpp server, SmolLM2-135M)", flush=True)
        try:
            with local.local_model() as model:
                print(f"followups dev: AI_BASE_URL={model.base_url}", flush=True)
                with_model = dataclasses.replace(base, ai=model.ai_settings(base.ai))
                return _run_dev(
                    with_model, data_dir=data_dir, host=host, port=port, demo=demo, model=model, wire=wire
                )
        except local.LocalModelUnavailable as exc:
            print(f"followups dev: --local-model: {exc}", file=sys.stderr)
            return 2


#: What dev does to the project once it has one (``--fake-provider``: wire the dev number to the fake).
Wire = Callable[[Runtime, uuid.UUID], None]


def _run_dev(
    base: Settings,
    *,
    data_dir: str,
    host: str,
    port: int,
    demo: bool,
    model: local.LocalModel | None,
    wire: Wire | None = None,
) -> int:
    import uvicorn

    from services.api.app import create_app
    from services.api.server import config as server_config
    from services.api.server import stop_on_signals

    folder = Path(data_dir).resolve()
    print(f"followups dev: starting the embedded PostgreSQL under {folder / PGDATA}", flush=True)
    server, url = start_embedded_postgres(folder)
    print(f"followups dev: DATABASE_URL={url}", flush=True)
    settings = dataclasses.replace(base, database=msgspec.structs.replace(base.database, url=url))
    try:
        migrate(url)
        pool = create_pool(settings.database, name="followups-dev")
    except BaseException:
        server.cleanup()
        raise
    runtime = Runtime(settings, pool, create_broker(settings.broker, embedded=True), SYSTEM_CLOCK)
    running = None
    try:
        project = dev_project(runtime, folder)
        if wire is not None:
            wire(runtime, project.project_id)
        if demo:
            _create_demo(runtime, project.project_id)
        running = start_services(runtime, sorted(SERVICES), LogPublisher())
        serve_metrics(settings.api.metrics_port)
        uvicorn_server = uvicorn.Server(
            server_config(create_app(runtime), settings.api, host=host, port=port)
        )
        stopped = threading.Event()
        banner = threading.Thread(
            target=_print_when_started,
            args=(uvicorn_server, stopped, welcome(project, folder, url, host, port, model)),
            name="dev-banner",
            daemon=True,
        )
        banner.start()
        stop_on_signals(uvicorn_server)
        try:
            uvicorn_server.run()
        finally:
            stopped.set()
        return 0 if uvicorn_server.started else 1
    finally:
        if running is not None:
            running.stop()
        pool.close()
        server.cleanup()


def _print_when_started(server: uvicorn.Server, stopped: threading.Event, text: str) -> None:
    """Print ``text`` once uvicorn listens (after its start-up lines), unless it stops first."""
    while not server.started:
        if stopped.wait(0.05):
            return
    print(text, flush=True)


def welcome(
    project: DevProject, folder: Path, url: str, host: str, port: int, model: local.LocalModel | None = None
) -> str:
    """The box printed once the API listens: where it is, the project, its API key, the database (and the
    local model, when there is one)."""
    api = f"http://{host}:{port}"
    key_file = _shown_path(folder / KEY_FILE)
    kept = f"new, saved to {key_file}" if project.new_key else f"from {key_file}"
    lines = [
        "followups dev is running",
        "",
        f"API           {api}   (OpenAPI: {api}/schema)",
        f"dashboard     {api}/app/   (sign in with the API key)",
        f"project       {project.project_id}",
        f"API key       {project.api_key}",
        f"              ({kept}: the same on every run)",
        f"DATABASE_URL  {url}",
        *(
            [f"AI model      {local.MODEL_NAME} (llama.cpp) at {model.base_url}: AI_BASE_URL"]
            if model is not None
            else []
        ),
        "",
        f'try           curl -H "Authorization: Bearer $(cat {key_file})" {api}/v1/contacts',
        f"new project   followups create-project NAME --data-dir {_shown_path(folder)}",
        "Ctrl-C stops.",
    ]
    width = max(len(line) for line in lines)
    rule = "+" + "-" * (width + 2) + "+"
    return "\n".join(["", rule, *(f"| {line:<{width}} |" for line in lines), rule, ""])


def _shown_path(path: Path) -> str:
    """``path`` relative to the working directory when it is under it (shorter to read and to copy)."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def dev_project(runtime: Runtime, folder: Path) -> DevProject:
    """The data folder's project and its API key: both reused when they are still in the database; a new
    key only when the stored one is missing or no longer authenticates; a new project only when the folder
    has none (or its database lost it)."""
    project_file, key_file = folder / PROJECT_FILE, folder / KEY_FILE
    with runtime.pool.connection() as conn:
        project_id = _stored_project(conn, project_file)
        if project_id is None:
            project = create_project(conn, "dev", now=runtime.clock.now())
            _write_private(key_file, project.api_key)
            project_file.write_text(f"{project.project_id}\n")
            return DevProject(project.project_id, project.api_key, created=True, new_key=True)
        api_key = _stored_key(conn, key_file, project_id, now=runtime.clock.now())
        if api_key is not None:
            return DevProject(project_id, api_key, created=False, new_key=False)
        api_key = create_key(
            conn, project_id, ApiKeyCreate(name="dev", scope="admin"), now=runtime.clock.now()
        ).api_key
        _write_private(key_file, api_key)
        return DevProject(project_id, api_key, created=False, new_key=True)


def _stored_project(conn: Connection[Any], project_file: Path) -> uuid.UUID | None:
    try:
        project_id = uuid.UUID(project_file.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    if conn.execute("SELECT 1 FROM projects WHERE id = %s", (project_id,)).fetchone() is None:
        return None
    return project_id


def _stored_key(conn: Connection[Any], key_file: Path, project_id: uuid.UUID, *, now: datetime) -> str | None:
    """The stored API key when it still authenticates as the project."""
    try:
        api_key = key_file.read_text().strip()
    except FileNotFoundError:
        return None
    key_file.chmod(0o600)  # in case it was copied or restored with looser permissions
    try:
        return api_key if authenticate(conn, api_key, now=now).project_id == project_id else None
    except Unauthorized:
        return None


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable and writable by its owner only (0600), replacing it whole."""
    partial = path.with_name(f".{path.name}.partial")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(descriptor, 0o600)
        os.write(descriptor, f"{text}\n".encode())
    finally:
        os.close(descriptor)
    os.replace(partial, path)


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
