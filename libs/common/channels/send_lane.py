"""The send lane: claims QUEUED messages, sends each through its number's provider, records what came of it.

Each :meth:`SendLane.tick` (a polling loop's, in ``followups worker send-lane``; replicas allowed) runs one
claim transaction, then returns while the sends run on the providers' event loop (many in flight, one
thread):

1. lock the numbers that have a channel, the least recently served first (``FOR UPDATE SKIP LOCKED``:
   another replica claiming for a number skips it), with their sends in flight across every replica;
2. settle what ran out: a send whose lease expired (its worker died during the call) is *unconfirmed*,
   never sent again; a retry or an unconfirmed send past the message's lifetime is FAILED (``expired``,
   ``unconfirmed``);
3. share the free slots (``SEND_LANE_CONCURRENCY`` less those busy here) among projects, then among each
   project's numbers, one slot at a time (:func:`share`), never beyond ``SEND_LANE_NUMBER_CONCURRENCY``
   in flight per number: one project's backlog delays another's first message by one batch at most;
4. take each number's due retries, then claim its QUEUED messages (QUEUED to PROCESSING, the platform's
   claim: from then on a reply no longer cancels them), each send leased and recorded *before* any
   request goes out: a send is at most once on our side.

Each send is one provider attempt (:class:`~libs.common.channels.providers.Providers`), no transaction
open; its outcome is written with others that finished meanwhile, in one transaction:

    Sent          message.status SENT with the provider's id; the send's row goes
    Rejected      message.status FAILED, ``error_code`` the provider's code; the row goes
    Retry         due again after the backoff (or the provider's ``Retry-After``), within the lifetime
    Unconfirmed   waits for the provider's status webhook (:func:`reconcile`), or the lifetime's end

A write fenced on the attempt: a late outcome of an attempt whose lease ran out changes nothing but a
SENT or FAILED that is news (the status reports are monotonic).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from psycopg import Connection
from psycopg.rows import dict_row, tuple_row

from libs.common.channels.providers import Outcome, Providers, Rejected, Retry, Sent, Unconfirmed
from libs.common.channels.setup import Channel, webhook_path
from libs.common.contracts.platform_events import MessageStatus
from libs.common.core import effects
from libs.common.core.db import buffered_pipeline, fetch_each
from libs.common.core.jobs import Backoff
from libs.common.core.metrics import SEND_LANE_IN_FLIGHT, SEND_LANE_SEND_SECONDS, SEND_LANE_SENDS
from libs.common.core.runtime import Runtime
from libs.common.core.sql import load_queries
from libs.common.ingress import apply_event
from libs.common.platform import send_lane
from libs.common.platform.send_lane import ClaimedMessage, NumberQuota

log = logging.getLogger(__name__)

QUERIES = load_queries("libs.common.channels", "send_lane.sql")

#: Most numbers one claim looks at (the others, served less recently, come first in the next claims).
MAX_NUMBERS_PER_CLAIM: Final = 1000
#: Threads writing outcomes at once (each a transaction for the outcomes that finished meanwhile).
MAX_WRITERS: Final = 2
#: How often a send lane settles leases run out and lifetimes ended (on its claim's clock).
SETTLE_EVERY: Final = timedelta(seconds=1)
#: How long past the request's deadline a send's lease lasts.
LEASE_SLACK: Final = timedelta(seconds=5)
#: The wait before a retry: 2 s, 4 s, 8 s ... at most 5 minutes (a provider's Retry-After wins).
RETRY_BACKOFF: Final = Backoff(first=timedelta(seconds=2), most=timedelta(minutes=5))

Key = tuple[uuid.UUID, uuid.UUID]


def share(free: int, demands: Iterable[tuple[uuid.UUID, uuid.UUID, int]]) -> dict[Key, int]:
    """``free`` slots shared among (project, number, demand): one slot per project in turn (in the order
    given), each project's going to its numbers in turn; no number gets more than its demand."""
    projects: dict[uuid.UUID, list[list[Any]]] = {}
    for project_id, number_id, demand in demands:
        if demand > 0:
            projects.setdefault(project_id, []).append([number_id, demand])
    quotas: dict[Key, int] = {}
    turn = {project_id: 0 for project_id in projects}
    while free > 0 and projects:
        for project_id in list(projects):
            numbers = projects[project_id]
            number = numbers[turn[project_id] % len(numbers)]
            quotas[(project_id, number[0])] = quotas.get((project_id, number[0]), 0) + 1
            number[1] -= 1
            free -= 1
            if number[1] == 0:
                numbers.remove(number)
            else:
                turn[project_id] += 1
            if not numbers:
                del projects[project_id]
            if free == 0:
                break
    return quotas


@dataclass(frozen=True)
class _Send:
    channel: Channel
    message: ClaimedMessage
    attempt: int
    expires_at: datetime


@dataclass(frozen=True)
class _Result:
    send: _Send
    outcome: Outcome


class SendLane:
    """Claims and sends (see the module); :meth:`tick` returns how many sends it started."""

    def __init__(self, runtime: Runtime, providers: Providers, *, wake: Any = None) -> None:
        self.runtime = runtime
        self.settings = runtime.settings.channels
        self.providers = providers
        self.wake = wake
        # the provider calls run on the providers' event loop; the outcomes are written by these threads
        self._writers = ThreadPoolExecutor(max_workers=MAX_WRITERS, thread_name_prefix="send-writer")
        self._lock = threading.Lock()
        #: Sends started and not yet recorded (``_idle`` is told when none is left); of them, provider
        #: calls in flight.
        self._busy = 0
        self._idle = threading.Condition(self._lock)
        self._calling = 0
        self._results: list[_Result] = []
        self._flushers = 0
        self._settled_at: datetime | None = None

    def tick(self) -> int:
        with self._lock:
            free = min(self.settings.concurrency - self._calling, self.settings.batch)
            busy = self._calling
        if free <= 0 or (busy and free < self.settings.concurrency // 4):
            return 0  # the sends finishing wake the loop: claim when a quarter of the slots is free
        now = self.runtime.clock.now()
        with effects.transaction(self.runtime) as conn:
            sends = self._claim(conn, free, now)
        with self._lock:
            self._busy += len(sends)
            self._calling += len(sends)
        SEND_LANE_IN_FLIGHT.inc(len(sends))
        for send in sends:
            started = time.monotonic()
            future = self.providers.send(send.channel, send.message)
            future.add_done_callback(functools.partial(self._sent, send, started))
        return len(sends)

    def _claim(self, conn: Connection[Any], free: int, now: datetime) -> list[_Send]:
        # the numbers in turn, read across projects; then each locked by its project and id (one round trip)
        candidates = conn.execute(QUERIES["channels_in_turn"], {"limit": MAX_NUMBERS_PER_CLAIM}).fetchall()
        each = [{"project_id": p, "number_id": n, "now": now} for p, n in candidates]
        rows = fetch_each(conn, QUERIES["lock_channel"], each, dict_row)
        if not rows:
            return []
        in_flight = {(r["project_id"], r["number_id"]): r.pop("in_flight") for r in rows}
        retries = {(r["project_id"], r["number_id"]): r.pop("retries_due") for r in rows}
        channels = {(r["project_id"], r["number_id"]): Channel(**r) for r in rows}
        keys = list(channels)
        pairs = {"project_ids": [p for p, _ in keys], "number_ids": [n for _, n in keys], "now": now}
        if self._settled_at is None or now - self._settled_at >= SETTLE_EVERY:
            self._settle(conn, pairs, now)
            self._settled_at = now
        bound = self.settings.number_concurrency
        room = {key: max(0, bound - in_flight[key]) for key in keys}
        queued = send_lane.queued_per_number(conn, [k for k in keys if room[k]], cap=bound)
        quotas = share(
            free, ((p, n, min(room[(p, n)], retries.get((p, n), 0) + queued.get((p, n), 0))) for p, n in keys)
        )
        if not quotas:
            return []
        lease_until = now + timedelta(seconds=self.settings.timeout_seconds) + LEASE_SLACK
        sends = self._retries(conn, channels, quotas, retries, now, lease_until)
        for send in sends:
            quotas[(send.message.project_id, send.channel.number_id)] -= 1
        wanted = [NumberQuota(project_id=p, number_id=n, quota=q) for (p, n), q in quotas.items() if q > 0]
        with buffered_pipeline(conn):  # the claim's writes that return nothing travel together
            claimed = send_lane.claim_for_numbers(conn, wanted, now=now)
            lifetime = timedelta(seconds=self.settings.message_lifetime_seconds)
            fresh = [
                _Send(channels[(m.project_id, m.number_id)], m, 1, m.created_at + lifetime)
                for m in claimed
                if m.number_id is not None
            ]
            if fresh:
                conn.execute(
                    QUERIES["start_sends"],
                    {
                        "project_ids": [s.message.project_id for s in fresh],
                        "message_ids": [s.message.id for s in fresh],
                        "number_ids": [s.channel.number_id for s in fresh],
                        "expires": [s.expires_at for s in fresh],
                        "lease_until": lease_until,
                    },
                )
            sends += fresh
            served = {(s.message.project_id, s.channel.number_id) for s in sends}
            if served:
                params = {
                    "project_ids": [p for p, _ in served],
                    "number_ids": [n for _, n in served],
                    "now": now,
                }
                conn.execute(QUERIES["served"], params)
        return sends

    def _retries(
        self,
        conn: Connection[Any],
        channels: dict[Key, Channel],
        quotas: dict[Key, int],
        due: dict[Key, int],
        now: datetime,
        lease_until: datetime,
    ) -> list[_Send]:
        """The due retries, up to each number's quota, leased again with their attempt counted."""
        wanted = {key: min(q, due[key]) for key, q in quotas.items() if due.get(key)}
        if not wanted:
            return []
        numbers: dict[uuid.UUID, dict[uuid.UUID, int]] = {}
        for (project_id, number_id), quota in wanted.items():
            numbers.setdefault(project_id, {})[number_id] = quota
        each = [  # one statement per project, all in one round trip
            {
                "project_id": project_id,
                "number_ids": list(quotas_of),
                "quotas": list(quotas_of.values()),
                "now": now,
                "lease_until": lease_until,
            }
            for project_id, quotas_of in numbers.items()
        ]
        claimed = fetch_each(conn, QUERIES["claim_retries"], each, tuple_row)
        attempts: dict[Key, int] = {(p, m): a for p, m, a in claimed}
        by_project: dict[uuid.UUID, list[uuid.UUID]] = {}
        for project_id, message_id in attempts:
            by_project.setdefault(project_id, []).append(message_id)
        lifetime = timedelta(seconds=self.settings.message_lifetime_seconds)
        sends = []
        for project_id, ids in by_project.items():
            for m in send_lane.claimed_messages(conn, project_id, ids):
                assert m.number_id is not None
                channel = channels[(project_id, m.number_id)]
                sends.append(_Send(channel, m, attempts[(project_id, m.id)], m.created_at + lifetime))
        return sends

    def _settle(self, conn: Connection[Any], pairs: dict[str, Any], now: datetime) -> None:
        """Leases run out become unconfirmed; retries and unconfirmed sends past their lifetime FAILED."""
        for project_id, message_id in conn.execute(QUERIES["expire_leases"], pairs).fetchall():
            log.warning(
                "send unconfirmed: its lease ran out",
                extra={"project_id": str(project_id), "message_id": str(message_id)},
            )
        expired = conn.execute(QUERIES["expired_sends"], pairs).fetchall()
        by_project: dict[uuid.UUID, dict[uuid.UUID, tuple[str, str | None]]] = {}
        for project_id, message_id, state, last_error in expired:
            by_project.setdefault(project_id, {})[message_id] = (state, last_error)
        for project_id, states in by_project.items():
            for m in send_lane.claimed_messages(conn, project_id, list(states)):  # still PROCESSING only
                state, last_error = states[m.id]
                code = "expired" if state == "retry" else "unconfirmed"
                error = f"{code}: the message's lifetime ended (last error: {last_error})"
                self._report(conn, m.project_id, m.id, "FAILED", now, error=error, error_code=code)
                SEND_LANE_SENDS.labels("-", "expired").inc()

    def _sent(self, send: _Send, started: float, future: Future[Outcome]) -> None:
        """A provider call ended (on the providers' event loop: nothing slow here): its outcome waits for
        a writer, one is started if fewer than :data:`MAX_WRITERS` are writing."""
        try:
            outcome = future.result()
        except Exception as exc:  # a bug of ours, not the provider's: the answer is unknown, never resend
            log.error("send failed", exc_info=exc, extra={"message_id": str(send.message.id)})
            outcome = Unconfirmed(f"internal_error:{type(exc).__name__}")
        SEND_LANE_SEND_SECONDS.labels(send.channel.provider).observe(time.monotonic() - started)
        SEND_LANE_IN_FLIGHT.dec()
        with self._lock:
            self._calling -= 1
            self._results.append(_Result(send, outcome))
            if self._flushers >= MAX_WRITERS:
                return  # a writer busy writing takes it with the next batch
            self._flushers += 1
        self._writers.submit(self._flush)

    def _flush(self) -> None:
        """Write the outcomes waiting (one transaction for those that finished together)."""
        while True:
            with self._lock:
                results, self._results = self._results, []
                if not results:
                    self._flushers -= 1
                    return
            try:
                self._write(results)
            except Exception:  # their sends stay leased: they become unconfirmed, never resent
                log.exception("send outcomes not recorded", extra={"count": len(results)})
            finally:
                with self._lock:
                    self._busy -= len(results)
                    if self._busy == 0:
                        self._idle.notify_all()
                if self.wake is not None:
                    self.wake()

    def _write(self, results: list[_Result]) -> None:
        now = self.runtime.clock.now()
        sent: dict[uuid.UUID, list[_Result]] = {}
        others = []
        for result in results:
            if isinstance(result.outcome, Sent):
                sent.setdefault(result.send.message.project_id, []).append(result)
            else:
                others.append(result)
        with effects.transaction(self.runtime) as conn:
            for project_id, batch in sent.items():
                try:
                    with effects.savepoint(conn):
                        self._record_sent(conn, project_id, batch, now)
                except Exception:  # one of them cannot be written: each on its own, to find it
                    log.warning("sent batch not written; one by one", extra={"project_id": str(project_id)})
                    others += batch
            for result in others:
                try:
                    with effects.savepoint(conn):
                        self._record(conn, result, now)
                except Exception:
                    log.exception(
                        "send outcome not recorded", extra={"message_id": str(result.send.message.id)}
                    )

    def _record_sent(
        self, conn: Connection[Any], project_id: uuid.UUID, batch: list[_Result], now: datetime
    ) -> None:
        """Messages the provider took, of one project: SENT in one statement, their sends settled."""
        pairs = [(r.send.message.id, _provider_id(r.outcome)) for r in batch]
        conn.execute(
            QUERIES["finish_sends"], {"project_id": project_id, "message_ids": [m for m, _ in pairs]}
        )
        send_lane.report_sent(conn, project_id, pairs, now=now)
        for result in batch:
            SEND_LANE_SENDS.labels(result.send.channel.provider, "sent").inc()
            log.info("provider send", extra=self._context(result) | {"outcome": "sent"})

    def _record(self, conn: Connection[Any], result: _Result, now: datetime) -> None:
        send, outcome = result.send, result.outcome
        message = send.message
        keys = {"project_id": message.project_id, "message_id": message.id, "attempt": send.attempt}
        extra = self._context(result)
        if isinstance(outcome, Sent):
            kind = "sent"
            conn.execute(QUERIES["finish_send"], keys)
            self._report(
                conn, message.project_id, message.id, "SENT", now, provider=outcome.provider_message_id
            )
            extra["provider_message_id"] = outcome.provider_message_id
        elif isinstance(outcome, Rejected):
            kind = "rejected"
            conn.execute(QUERIES["finish_send"], keys)
            self._report(
                conn,
                message.project_id,
                message.id,
                "FAILED",
                now,
                error=outcome.error,
                error_code=outcome.code,
            )
            extra["error_code"] = outcome.code
        elif isinstance(outcome, Retry):
            delay = RETRY_BACKOFF.delay(send.attempt)
            if outcome.retry_after is not None:
                delay = max(delay, timedelta(seconds=min(outcome.retry_after, 3600)))
            if now + delay >= send.expires_at:
                kind = "expired"
                conn.execute(QUERIES["finish_send"], keys)
                error = f"expired: the message's lifetime ended (last error: {outcome.error})"
                self._report(
                    conn, message.project_id, message.id, "FAILED", now, error=error, error_code="expired"
                )
            else:
                kind = "retry"
                params = keys | {"next_attempt_at": now + delay, "error": outcome.error}
                conn.execute(QUERIES["retry_send"], params)
            extra["error"] = outcome.error
        else:
            kind = "unconfirmed"
            conn.execute(QUERIES["unconfirm_send"], keys | {"error": outcome.error})
            extra["error"] = outcome.error
        SEND_LANE_SENDS.labels(send.channel.provider, kind).inc()
        extra["outcome"] = kind
        (log.info if kind == "sent" else log.warning)("provider send", extra=extra)

    @staticmethod
    def _context(result: _Result) -> dict[str, Any]:
        """The log context of a send's outcome."""
        send = result.send
        extra: dict[str, Any] = {
            "project_id": str(send.message.project_id),
            "message_id": str(send.message.id),
            "number_id": str(send.channel.number_id),
            "provider": send.channel.provider,
            "attempt": send.attempt,
        }
        if isinstance(result.outcome, Sent):
            extra["provider_message_id"] = result.outcome.provider_message_id
        return extra

    def _report(
        self,
        conn: Connection[Any],
        project_id: uuid.UUID,
        message_id: uuid.UUID,
        status: Any,
        now: datetime,
        *,
        provider: str | None = None,
        error: str | None = None,
        error_code: str | None = None,
    ) -> None:
        event = MessageStatus(
            status=status,
            message_id=message_id,
            provider_message_id=provider,
            error=error,
            error_code=error_code,
        )
        apply_event(conn, project_id, event, now=now)

    def close(self) -> None:
        """Wait for the sends in flight (their outcomes recorded); the providers' client stays open."""
        with self._lock:
            self._idle.wait_for(lambda: self._busy == 0)
        self._writers.shutdown(wait=True)


def _provider_id(outcome: Outcome) -> str:
    assert isinstance(outcome, Sent)
    return outcome.provider_message_id


def reconcile(conn: Connection[Any], project_id: uuid.UUID, message_ids: list[uuid.UUID]) -> None:
    """A status arrived for these messages: their unconfirmed sends are settled."""
    if message_ids:
        conn.execute(QUERIES["reconciled"], {"project_id": project_id, "message_ids": message_ids})


def callback_url(public_url: str | None) -> Callable[[Channel, ClaimedMessage], str | None]:
    """The status callback of a message (Twilio's ``StatusCallback``): its number's webhook with our id."""

    def url(channel: Channel, message: ClaimedMessage) -> str | None:
        if public_url is None:
            return None
        path = webhook_path(channel.provider, channel.number_id)
        return f"{public_url.rstrip('/')}{path}?message_id={message.id}"

    return url
