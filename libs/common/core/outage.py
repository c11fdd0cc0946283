"""Outages that read well in the logs: one warning when a server stops answering, one info when it answers
again, never a line (nor a traceback) per attempt in between.

:class:`Outage` tracks one server as one caller sees it (RabbitMQ for a sender, a listener, a consumer;
PostgreSQL for the whole process: :data:`libs.common.core.db.DATABASE`), and spaces the attempts out
(1 s doubling to 30 s, :meth:`Outage.allow`) for the callers that want it, so that the ones that are not
trying fail at once instead of each waiting out a timeout.
"""

from __future__ import annotations

import logging
import threading
import time

#: After a failure, the next attempt comes this long later, then twice as long each time, up to
#: :data:`OUTAGE_MAX_RETRY_SECONDS`; the calls in between fail at once.
OUTAGE_FIRST_RETRY_SECONDS = 1.0
OUTAGE_MAX_RETRY_SECONDS = 30.0


class Outage:
    """Whether a server (``server``: "RabbitMQ", "PostgreSQL") answers one caller: one warning when it
    stops, one info when it answers again, and in between (:meth:`allow`) one attempt after 1 s, then 2,
    4, ... up to 30 s."""

    def __init__(
        self,
        logger: logging.Logger,
        consequence: str,
        *,
        server: str = "RabbitMQ",
        first_retry: float = OUTAGE_FIRST_RETRY_SECONDS,
        max_retry: float = OUTAGE_MAX_RETRY_SECONDS,
    ) -> None:
        #: What the outage means, for the warning: "nudges are dropped", "events wait in the outbox".
        self.consequence = consequence
        self.server = server
        self._log = logger
        self._first_retry = first_retry
        self._max_retry = max_retry
        self._lock = threading.Lock()
        self._since: float | None = None
        self._retry = first_retry
        self._next_attempt = 0.0

    @property
    def down(self) -> bool:
        return self._since is not None

    def allow(self) -> bool:
        """Whether to try the server now: always while it answers; during an outage, once per retry delay
        (the caller that gets True makes the attempt, and reports it with :meth:`failed` or
        :meth:`succeeded`)."""
        with self._lock:
            now = time.monotonic()
            if self._since is None or now >= self._next_attempt:
                if self._since is not None:
                    self._next_attempt = now + self._retry  # one attempt at a time
                return True
            return False

    def failed(self, error: BaseException) -> None:
        with self._lock:
            now = time.monotonic()
            if self._since is None:
                self._since = now
                self._retry = self._first_retry
                self._log.warning(
                    "%s unreachable: %s until it answers",
                    self.server,
                    self.consequence,
                    extra={"error": repr(error)},
                )
            else:
                self._retry = min(self._retry * 2, self._max_retry)
                self._log.debug("%s still unreachable", self.server, extra={"error": repr(error)})
            self._next_attempt = now + self._retry

    def succeeded(self) -> None:
        if self._since is None:  # the common case, without the lock
            return
        with self._lock:
            if self._since is None:
                return
            seconds = time.monotonic() - self._since
            self._since = None
            self._log.info(
                "%s answers again",
                self.server,
                extra={"after": self.consequence, "outage_seconds": round(seconds, 3)},
            )
