"""The ``followups`` command."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import msgspec

from followups.dev import DEFAULT_DATA_DIR, NoEmbeddedDatabase, embedded_database
from followups.runner import SERVICES, serve_metrics, shutdown_requested, start_services
from libs.common.core.broker import create_broker
from libs.common.core.clock import SYSTEM_CLOCK
from libs.common.core.db import create_pool
from libs.common.core.errors import InvalidInput
from libs.common.core.invalidation import Invalidator
from libs.common.core.logs import configure_logging
from libs.common.core.migrate import migrate
from libs.common.core.outbox import AmqpPublisher
from libs.common.core.runtime import Runtime
from libs.common.core.settings import LogSettings, Settings, SettingsError
from libs.common.platform.projects import create_project

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
    return parser


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
    if args.command == "dev":
        from followups.dev import run_dev

        host = settings.api.host if args.host is None else args.host
        port = settings.api.port if args.port is None else args.port
        return run_dev(settings, data_dir=args.data_dir, host=host, port=port, demo=args.demo)
    if args.command == "migrate":
        applied = migrate(settings.database.url)
        print(f"{len(applied)} migration(s) applied")
        return 0
    if args.command == "create-project":
        return _create_project(settings, args.name, timezone=args.timezone, data_dir=args.data_dir)
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


def _create_project(settings: Settings, name: str, *, timezone: str, data_dir: str | None) -> int:
    """Create a project in DATABASE_URL's database, or in the embedded one of a ``followups dev`` data
    folder; never in a default database nobody named."""
    if data_dir is None and not os.environ.get("DATABASE_URL"):
        print(
            "followups: create-project needs a database: set DATABASE_URL, or pass --data-dir with the data"
            f" folder of `followups dev` (--data-dir {DEFAULT_DATA_DIR} unless it was given another)",
            file=sys.stderr,
        )
        return 2
    with contextlib.ExitStack() as stack:
        database = settings.database
        if data_dir is not None:
            try:
                url = stack.enter_context(embedded_database(Path(data_dir)))
            except NoEmbeddedDatabase as exc:
                print(f"followups: {exc}", file=sys.stderr)
                return 2
            database = msgspec.structs.replace(database, url=url, pool_min_size=1, pool_max_size=1)
        pool = stack.enter_context(create_pool(database, name="followups-create-project"))
        try:
            with pool.connection() as conn:
                project = create_project(conn, name, timezone=timezone)
        except InvalidInput as exc:
            print(f"followups: create-project: {exc.message}", file=sys.stderr)
            return 2
    print(f"project_id: {project.project_id}\napi_key: {project.api_key}")
    return 0


def _run_api(runtime: Runtime, *, host: str, port: int) -> int:
    import uvicorn

    from services.api import server
    from services.api.app import create_app

    serve_metrics(runtime.settings.api.metrics_port)
    uvicorn.Server(server.config(create_app(runtime), runtime.settings.api, host=host, port=port)).run()
    runtime.invalidator.stop()
    runtime.pool.close()
    return 0


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
