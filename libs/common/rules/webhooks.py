"""Webhook deliveries: the delivery side of a rule's ``send_webhook`` action (a rule POSTs JSON to a URL).

A delivery is queued with :func:`queue_delivery` in the transaction of the rule run that decided it, then
sent by :func:`deliver` (one attempt), :func:`deliver_due` (a batch, waited for) or a :class:`Dispatcher`
(what the triggers service's polling loop ticks: up to ``WEBHOOK_CONCURRENCY`` attempts in parallel, at most
``WEBHOOK_PROJECT_CONCURRENCY`` of one project's, the claim taking each project's oldest in turn, so one
tenant's slow endpoints hold only its own slots; webhooks go out with RabbitMQ down). An attempt is three
steps, and no transaction or row lock is held during the HTTP call:

1. claim: lock the pending, due row ``FOR UPDATE SKIP LOCKED``, count the attempt and lease the row
   (``next_attempt_at`` = now + timeout + slack, so no other worker picks it during the call), commit;
2. POST the JSON body (:func:`libs.common.rules.egress.post`: to a checked address only, one deadline of
   ``WEBHOOK_TIMEOUT_SECONDS`` for lookup, connect, send and the response's head), redirects not followed;
3. record the result in a second transaction: a 2xx response delivers it; anything else (another status,
   a timeout, a refused connection, a DNS error, a denied address) schedules a retry with backoff (30 s,
   1 min, 2 min, ..., capped at 1 h), and after :data:`MAX_ATTEMPTS` attempts the delivery is ``failed``. A
   result that comes after its lease ran out and another worker claimed the delivery again is not recorded.
   ``last_error`` is a class (``http_<status>``, ``timeout``, ``connect_refused``, ``tls_error``,
   ``bad_response``, ``blocked_address``, ``dns_error``, ``connect_error``), never the peer's bytes. A
   delivery is never claimed past its last attempt: one whose result could not be recorded is given up
   (``failed``) when its lease runs out.

Each request carries::

    Content-Type: application/json
    User-Agent: followups-webhooks
    X-Followups-Delivery: <delivery id>
    X-Followups-Timestamp: <unix seconds>
    X-Followups-Signature: sha256=<hex HMAC-SHA256 of "<timestamp>.<delivery id>.<body>" keyed by the
                           project's secret>

While a rotation of the secret overlaps (``libs.common.platform.webhook_secrets``), the signature header
lists one signature per valid secret, the new one first: ``sha256=<by the new>, sha256=<by the old>``.
A receiver checks the signatures over the body bytes exactly as received, with :func:`verify_signature` or
its equivalent (any one that matches its secret verifies), and should reject timestamps too far from its
own clock (a replayed request). The signature covers the delivery id, so a body replayed under another
delivery id does not verify. A delivery is at least once: a receiver deduplicates on
``X-Followups-Delivery``.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import threading
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime, timedelta
from typing import Any, Final, Literal
from urllib.parse import urlsplit

import msgspec
from psycopg import Connection
from psycopg.rows import class_row
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from libs.common.core.clock import Clock
from libs.common.core.errors import InvalidInput, NotFound
from libs.common.core.jobs import (
    STANDARD_BACKOFF,
    Failed,
    Failure,
    Fairness,
    Queue,
    Retry,
    run_item,
)
from libs.common.core.metrics import WEBHOOK_ATTEMPT_ERRORS, WEBHOOK_DELIVERIES, WEBHOOK_IN_FLIGHT
from libs.common.core.sql import load_queries
from libs.common.rules import egress

log = logging.getLogger(__name__)

QUERIES = load_queries("libs.common.rules", "webhooks.sql")

#: How a delivery that failed is retried: 30 s, doubling with each failed attempt, at most an hour; given up
#: (``failed``) after the eighth attempt.
RETRY: Final = Retry(max_attempts=8, backoff=STANDARD_BACKOFF)
#: Attempts before a delivery is given up (``failed``).
MAX_ATTEMPTS: Final = RETRY.max_attempts
#: The deadline of one attempt, unless the caller gives one (``WEBHOOK_TIMEOUT_SECONDS``).
DEFAULT_TIMEOUT_S: Final = 10.0
#: How long past the call's timeout a claimed delivery stays leased to its worker.
LEASE_SLACK: Final = timedelta(seconds=30)
#: Longest ``last_error`` kept.
MAX_ERROR_LENGTH: Final = 200
USER_AGENT: Final = "followups-webhooks"
SIGNATURE_PREFIX: Final = "sha256="

Status = Literal["pending", "delivered", "failed"]
STATUSES: Final = frozenset({"pending", "delivered", "failed"})
Outcome = Literal["delivered", "retry", "failed"]


class Delivery(msgspec.Struct, kw_only=True, frozen=True):
    id: uuid.UUID
    project_id: uuid.UUID
    rule_id: uuid.UUID | None
    #: The public id of the trigger it came of (None: queued by hand).
    trigger_id: uuid.UUID | None
    url: str
    payload: dict[str, Any]
    status: str
    attempts: int
    #: When the next attempt is due (pending only; a claimed delivery's lease while its call runs).
    next_attempt_at: datetime | None
    #: The HTTP status of the last attempt (None: no response, see ``last_error``).
    last_status_code: int | None
    last_error: str | None
    created_at: datetime
    delivered_at: datetime | None
    updated_at: datetime


class DeliveryState(msgspec.Struct, kw_only=True, frozen=True):
    """A delivery's state after an attempt."""

    id: uuid.UUID
    project_id: uuid.UUID
    rule_id: uuid.UUID | None
    status: str
    attempts: int
    next_attempt_at: datetime | None
    last_status_code: int | None
    last_error: str | None
    delivered_at: datetime | None


class _Claimed(msgspec.Struct, kw_only=True, frozen=True):
    id: uuid.UUID
    project_id: uuid.UUID
    rule_id: uuid.UUID | None
    url: str
    payload: dict[str, Any]
    attempts: int
    secret: str
    #: The secret a rotation replaced, while its overlap runs (it signs too).
    previous_secret: str | None


class _Result(msgspec.Struct, kw_only=True, frozen=True):
    status_code: int | None
    error: str | None

    @property
    def ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


def queue_delivery(
    conn: Connection[Any],
    project_id: uuid.UUID,
    *,
    rule_id: uuid.UUID | None,
    trigger_id: uuid.UUID | None,
    url: str,
    payload: dict[str, Any],
    now: datetime,
) -> uuid.UUID:
    """Queue a delivery of ``payload`` to ``url`` in the caller's transaction, due at once; returns its id."""
    validate_url(url)
    params = {
        "project_id": project_id,
        "rule_id": rule_id,
        "trigger_id": trigger_id,
        "url": url,
        "payload": Jsonb(payload),
        "now": now,
    }
    row = conn.execute(QUERIES["insert_delivery"], params).fetchone()
    assert row is not None
    delivery_id: uuid.UUID = row[0]
    return delivery_id


def deliver(
    pool: ConnectionPool,
    project_id: uuid.UUID,
    delivery_id: uuid.UUID,
    *,
    now: datetime,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    resolve: egress.Resolver = egress.system_resolver,
) -> DeliveryState | None:
    """Make one attempt at a due pending delivery of the project; its state after, or None when it was not
    attempted (not pending, not due, at its last attempt already, or busy: claimed by another worker)."""
    deliveries = _Deliveries(pool, lambda: now, timeout_s, resolve)
    run_item(deliveries, (project_id, delivery_id))
    return deliveries.states.get(delivery_id)


def deliver_due(
    pool: ConnectionPool,
    clock: Clock,
    limit: int = 50,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    concurrency: int = 16,
    per_project: int = 4,
) -> int:
    """Attempt up to ``limit`` pending deliveries due by now (each project's oldest in turn, at most
    ``per_project`` of one project's), ``concurrency`` at once, and wait for them; returns how many were
    attempted."""
    dispatcher = Dispatcher(
        pool, clock, timeout_s=timeout_s, concurrency=concurrency, per_project=per_project, batch=limit
    )
    try:
        dispatcher.tick()
    finally:
        dispatcher.close()
    return len(dispatcher.states)


class Dispatcher:
    """Delivers due webhooks in parallel, fair per project: each :meth:`tick` (a polling loop's) fills the
    free slots of ``concurrency`` with due deliveries, each project's oldest in turn, never more than
    ``per_project`` of one project's in flight, and returns at once (the attempts run in its threads;
    ``wake`` is called as each ends, so the loop fills the freed slot)."""

    def __init__(
        self,
        pool: ConnectionPool,
        clock: Clock,
        *,
        timeout_s: float,
        concurrency: int,
        per_project: int,
        batch: int | None = None,
        wake: Callable[[], None] | None = None,
        resolve: egress.Resolver = egress.system_resolver,
    ) -> None:
        self.pool = pool
        self.clock = clock
        self.timeout_s = timeout_s
        self.concurrency = concurrency
        self.per_project = per_project
        self.batch = batch if batch is not None else concurrency
        self.wake = wake
        self.resolve = resolve
        self.states: dict[uuid.UUID, DeliveryState] = {}
        self._executor = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="webhooks")
        self._lock = threading.Lock()
        #: The deliveries in flight, and their projects.
        self._busy: dict[uuid.UUID, uuid.UUID] = {}

    def tick(self) -> int:
        """Start attempts in the free slots; returns how many started."""
        now = self.clock.now()
        with self._lock:
            busy = list(self._busy)
            free = min(self.concurrency - len(busy), self.batch)
            counts: dict[uuid.UUID, int] = {}
            for project_id in self._busy.values():
                counts[project_id] = counts.get(project_id, 0) + 1
        if free <= 0:
            return 0
        saturated = [p for p, n in counts.items() if n >= self.per_project]
        params = {
            "now": now,
            "limit": free + sum(counts.values()),
            "per_project": self.per_project,
            "max_attempts": MAX_ATTEMPTS,
            "busy": busy,
            "saturated": saturated,
        }
        with self.pool.connection() as conn:
            for gave_up in conn.execute(QUERIES["give_up_exhausted"], params):
                WEBHOOK_DELIVERIES.labels("failed").inc()
                log.warning(
                    "webhook delivery given up: its last attempt's result was not recorded",
                    extra={"delivery_id": str(gave_up[0]), "project_id": str(gave_up[1])},
                )
            due = conn.execute(QUERIES["due_deliveries"], params).fetchall()
        started = 0
        for delivery_id, project_id in due:
            if started >= free:
                break
            if counts.get(project_id, 0) >= self.per_project:
                continue
            counts[project_id] = counts.get(project_id, 0) + 1
            with self._lock:
                self._busy[delivery_id] = project_id
            WEBHOOK_IN_FLIGHT.inc()
            self._executor.submit(self._attempt, project_id, delivery_id)
            started += 1
        return started

    def _attempt(self, project_id: uuid.UUID, delivery_id: uuid.UUID) -> None:
        deliveries = _Deliveries(self.pool, self.clock.now, self.timeout_s, self.resolve)
        try:
            run_item(deliveries, (project_id, delivery_id))
            with self._lock:
                self.states.update(deliveries.states)
        finally:
            with self._lock:
                self._busy.pop(delivery_id, None)
            WEBHOOK_IN_FLIGHT.dec()
            if self.wake is not None:
                self.wake()

    def close(self) -> None:
        """Wait for the attempts in flight."""
        self._executor.shutdown(wait=True)


def backoff(attempts: int) -> timedelta:
    """The wait after the ``attempts``-th failed attempt: 30 s, 1 min, 2 min, 4 min ... capped at 1 h."""
    return STANDARD_BACKOFF.delay(attempts)


#: What a failed attempt hands its writer: the claimed delivery, the call's result, the attempt's time.
_Attempted = tuple[_Claimed, _Result, datetime]
#: A delivery to attempt: its project and id.
_Due = tuple[uuid.UUID, uuid.UUID]


class _Deliveries(Queue[_Due, ConnectionPool]):
    """The webhook deliveries queue: the due deliveries, each attempt claimed (and counted) in a transaction
    of its own, the call made with no transaction open, the result recorded in a second transaction."""

    retry = RETRY

    def __init__(
        self,
        pool: ConnectionPool,
        now: Callable[[], datetime],
        timeout_s: float,
        resolve: egress.Resolver = egress.system_resolver,
    ) -> None:
        self.pool = pool
        self.now = now
        self.timeout_s = timeout_s
        self.resolve = resolve
        #: The state of each delivery attempted, after its attempt.
        self.states: dict[uuid.UUID, DeliveryState] = {}

    def claim(self, limit: int, fairness: Fairness) -> list[_Due]:
        """Due deliveries, each project's oldest in turn (the :class:`Dispatcher` bounds those in flight)."""
        params = {
            "now": self.now(),
            "limit": limit,
            "per_project": limit,
            "max_attempts": MAX_ATTEMPTS,
            "busy": [],
            "saturated": [],
        }
        with self.pool.connection() as conn:
            return [(row[1], row[0]) for row in conn.execute(QUERIES["due_deliveries"], params)]

    def isolate(self) -> AbstractContextManager[ConnectionPool]:
        return nullcontext(self.pool)  # each step holds a transaction of its own, none during the call

    def run(self, ctx: ConnectionPool, item: _Due) -> Failed | None:
        now = self.now()
        lease_until = now + timedelta(seconds=self.timeout_s) + LEASE_SLACK
        project_id, delivery_id = item
        params = {
            "project_id": project_id,
            "id": delivery_id,
            "now": now,
            "lease_until": lease_until,
            "max_attempts": MAX_ATTEMPTS,
        }
        with ctx.connection() as conn, conn.cursor(row_factory=class_row(_Claimed)) as cur:
            claimed = cur.execute(QUERIES["claim_delivery"], params).fetchone()
        if claimed is None:
            return None
        # the claim is committed: the call runs with no transaction and no lock held
        result = _post(claimed, now=now, timeout_s=self.timeout_s, resolve=self.resolve)
        if result.ok:
            self._write(ctx, claimed, result, "delivered", None, now)
            return None
        attempted: _Attempted = (claimed, result, now)
        return Failed(result.error or "failed", attempt=claimed.attempts, about=attempted)

    def record(self, ctx: ConnectionPool, item: _Due, failure: Failure) -> bool:
        claimed, result, now = failure.about
        outcome: Outcome = "failed" if failure.given_up else "retry"
        retry_at = None if failure.given_up else failure.retry_at(now)
        return self._write(ctx, claimed, result, outcome, retry_at, now)

    def describe(self, item: _Due) -> dict[str, Any]:
        return {"project_id": str(item[0]), "delivery_id": str(item[1])}

    def _write(
        self,
        pool: ConnectionPool,
        claimed: _Claimed,
        result: _Result,
        outcome: Outcome,
        retry_at: datetime | None,
        now: datetime,
    ) -> bool:
        """Record an attempt's result (unless its lease ran out and it was claimed again), count and log it;
        returns whether it was recorded."""
        params = {
            "project_id": claimed.project_id,
            "id": claimed.id,
            "attempts": claimed.attempts,
            "status": "pending" if outcome == "retry" else outcome,
            "next_attempt_at": retry_at,
            "status_code": result.status_code,
            "error": _clean(result.error),
            "delivered_at": now if outcome == "delivered" else None,
            "now": now,
        }
        with pool.connection() as conn, conn.cursor(row_factory=class_row(DeliveryState)) as cur:
            state = cur.execute(QUERIES["record_attempt"], params).fetchone()
            recorded = state is not None
            if state is None:
                params = {"project_id": claimed.project_id, "id": claimed.id}
                state = cur.execute(QUERIES["delivery_state"], params).fetchone()
        if state is not None:
            self.states[claimed.id] = state
        WEBHOOK_DELIVERIES.labels(outcome).inc()
        if result.error is not None:
            WEBHOOK_ATTEMPT_ERRORS.labels("http" if result.status_code else result.error).inc()
        extra = {
            "delivery_id": str(claimed.id),
            "project_id": str(claimed.project_id),
            "rule_id": str(claimed.rule_id) if claimed.rule_id else None,
            "url_host": urlsplit(claimed.url).hostname,
            "status_code": result.status_code,
            "outcome": outcome,
            "attempt": claimed.attempts,
            "error": result.error,
        }
        if not recorded:
            log.warning(
                "webhook attempt not recorded: its lease ran out and it was claimed again", extra=extra
            )
        elif outcome == "delivered":
            log.info("webhook attempt", extra=extra)
        else:
            log.warning("webhook attempt", extra=extra)
        return recorded


def get_delivery(conn: Connection[Any], project_id: uuid.UUID, delivery_id: uuid.UUID) -> Delivery:
    with conn.cursor(row_factory=class_row(Delivery)) as cur:
        params = {"project_id": project_id, "id": delivery_id}
        delivery = cur.execute(QUERIES["get_delivery"], params).fetchone()
    if delivery is None:
        raise NotFound("webhook delivery not found", field="delivery_id")
    return delivery


def list_deliveries(
    conn: Connection[Any],
    project_id: uuid.UUID,
    *,
    rule_id: uuid.UUID | None = None,
    status: str | None = None,
    limit: int,
    after: uuid.UUID | None = None,
) -> list[Delivery]:
    """The project's deliveries in id order, after the cursor ``after``, optionally of one rule or status."""
    if status is not None and status not in STATUSES:
        raise InvalidInput(f"status must be one of {', '.join(sorted(STATUSES))}", field="status")
    params = {"project_id": project_id, "rule_id": rule_id, "status": status, "limit": limit, "after": after}
    with conn.cursor(row_factory=class_row(Delivery)) as cur:
        return cur.execute(QUERIES["list_deliveries"], params).fetchall()


def sign(secret: str, timestamp: int | str, body: bytes, *, delivery_id: uuid.UUID | str) -> str:
    """The signature of ``body`` of delivery ``delivery_id`` sent at ``timestamp`` (unix seconds) with
    ``secret``: ``sha256=<hex HMAC-SHA256 of "<timestamp>.<delivery id>.<body>">``."""
    signed = f"{timestamp}.{delivery_id}.".encode() + body
    return SIGNATURE_PREFIX + hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def signature_header(
    secrets: Sequence[str], timestamp: int | str, body: bytes, *, delivery_id: uuid.UUID | str
) -> str:
    """The ``X-Followups-Signature`` value: one signature per valid secret, newest first, comma-separated
    (one signature, as ever, outside a rotation's overlap)."""
    return ", ".join(sign(secret, timestamp, body, delivery_id=delivery_id) for secret in secrets)


def verify_signature(
    secret: str,
    timestamp: int | str,
    body: bytes | str,
    signature: str,
    *,
    delivery_id: uuid.UUID | str,
) -> bool:
    """Whether ``signature`` (the ``X-Followups-Signature`` header: one signature, or a comma-separated
    list during a rotation's overlap) signs ``body`` (the request body, as received) of ``delivery_id``
    (the ``X-Followups-Delivery`` header) at ``timestamp`` (the ``X-Followups-Timestamp`` header) with
    ``secret``, the webhook secret the receiver holds: any one of the listed signatures that matches
    verifies.

    Each comparison takes the same time wherever the signatures differ. It does not judge the timestamp's
    age: a receiver should also reject one too far from its own clock (five minutes, say), and deduplicate
    on the delivery id."""
    raw = body.encode() if isinstance(body, str) else body
    expected = sign(secret, str(timestamp).strip(), raw, delivery_id=str(delivery_id).strip()).encode()
    listed = [candidate.strip().encode() for candidate in signature.split(",")]
    return any([hmac.compare_digest(expected, candidate) for candidate in listed])


def validate_url(url: str, *, field: str = "url") -> str:
    """``url`` if it is an absolute http or https URL with a host that is not a denied literal address
    (:mod:`libs.common.rules.egress`: loopback, private, link-local ... in any numeric spelling, unless
    ``WEBHOOK_ALLOWED_NETWORKS`` opens it), else InvalidInput naming ``field`` (a rule's action checks its
    URL with this when the rule is saved). A name is checked when each attempt resolves it."""
    try:
        parts = urlsplit(url)
        hostname = parts.hostname
        parts.port  # noqa: B018 - a port out of range or not a number raises here
    except ValueError:  # an unbalanced IPv6 bracket, a bad port
        hostname = None
    if hostname is None or parts.scheme not in ("http", "https") or any(c.isspace() for c in url):
        raise InvalidInput("the webhook URL must be an absolute http or https URL", field=field)
    if "\x00" in url:
        raise InvalidInput("the webhook URL must not contain NUL characters", field=field)
    if len(url) > 2000:
        raise InvalidInput("the webhook URL has at most 2000 characters", field=field)
    if egress.check_literal(url) is not None:
        raise InvalidInput(
            "the webhook URL's host is a loopback, private, link-local or otherwise internal address;"
            " webhooks go to public addresses only (the operator opens others with"
            " WEBHOOK_ALLOWED_NETWORKS)",
            field=field,
        )
    return url


def _post(claimed: _Claimed, *, now: datetime, timeout_s: float, resolve: egress.Resolver) -> _Result:
    body = msgspec.json.encode(claimed.payload)
    timestamp = int(now.timestamp())
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "X-Followups-Delivery": str(claimed.id),
        "X-Followups-Timestamp": str(timestamp),
        "X-Followups-Signature": signature_header(_secrets(claimed), timestamp, body, delivery_id=claimed.id),
    }
    response = egress.post(claimed.url, body, headers, timeout_s=timeout_s, resolve=resolve)
    code = response.status_code
    if code is None:
        return _Result(status_code=None, error=response.error or "bad_response")
    return _Result(status_code=code, error=None if 200 <= code < 300 else f"http_{code}")


def _secrets(claimed: _Claimed) -> list[str]:
    """The secrets that sign the claimed delivery, newest first."""
    return [claimed.secret] if claimed.previous_secret is None else [claimed.secret, claimed.previous_secret]


def _clean(text: str | None) -> str | None:
    """``text`` as it may be stored: printable ASCII only, at most :data:`MAX_ERROR_LENGTH` characters."""
    if text is None:
        return None
    return "".join(c if " " <= c <= "~" else "?" for c in text)[:MAX_ERROR_LENGTH]
