"""Publisher confirms for a batch: publish every message of it, then wait for their confirms together.

pika's ``BlockingChannel`` in confirm mode waits inside each ``basic_publish`` for that message's confirm:
one round trip to RabbitMQ, and one of its disk writes, per message. AMQP does not ask for that. After
``Confirm.Select`` RabbitMQ numbers a channel's publishes 1, 2, 3, ... (the delivery tags) and answers
each with ``Basic.Ack``, or ``Basic.Nack`` when it could not take it, often many in one frame
(``multiple``: every tag up to this one). :class:`ConfirmWindow` publishes on the blocking channel's
underlying pika channel (``channel._impl``), which only writes the frames, keeps at most ``window``
messages unconfirmed (none: the whole batch), and then waits for the rest: a batch of 500 costs a few
round trips instead of 500. A window of 1 is the old way, one confirm at a time (``make bench-outbox``
measures both).

What :meth:`ConfirmWindow.publish_all` promises its caller:

- it returns only once RabbitMQ acknowledged every message given; a ``Basic.Nack`` of any of them raises
  :class:`Nacked`, a lost or closed connection or channel raises pika's error, an answer that does not
  come raises :class:`~libs.common.core.broker.BrokerTimeout`. On any exception the caller must count the
  whole batch as unpublished and drop the connection (a later ack of an old tag would confuse a new
  batch): some of its messages may have reached their queues, so publishing it again duplicates them;
- the messages go out in the order given, on one channel, which RabbitMQ keeps into each queue;
- every wait is bounded: no answer (an ack, a nack, the output written) for ``timeout`` seconds drops the
  connection (:func:`~libs.common.core.broker.answer_within`, the same timer as every other wait).

It waits with the blocking channel's own loop (``_flush_output``: the socket written and read until a
condition holds, what ``BlockingChannel`` does for each of its calls), one of pika's internals beside
``_impl``; pika's ``SelectConnection`` would be the public way, at the price of a second connection code
path beside :class:`~libs.common.core.broker.Nodes`, its failover and its bounded waits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pika.exceptions
import pika.frame
import pika.spec

from libs.common.core.broker import answer_within

#: One message: routing key, body, properties.
Message = tuple[str, bytes, pika.BasicProperties]

#: Messages handed to the socket at a time while a batch is published: RabbitMQ starts on the first ones
#: while the rest are encoded.
WRITE_CHUNK = 100


class Nacked(Exception):
    """RabbitMQ refused a message (Basic.Nack): the batch is not published."""


class ConfirmWindow:
    """Publisher confirms on ``channel`` (a ``pika.BlockingChannel`` of ``connection``), turned on here,
    counted here: publish with :meth:`publish_all` only (a publish of the channel's own would shift the
    delivery tags)."""

    def __init__(self, connection: Any, channel: Any, *, timeout: float) -> None:
        self._connection = connection
        self._channel = channel
        self._impl = channel._impl
        self._timeout = timeout
        #: The delivery tag of the last message published.
        self.published = 0
        #: Every tag up to this one is acknowledged.
        self.confirmed = 0
        self._acked_above: set[int] = set()  # single acks above ``confirmed``, in case they come unordered
        self._answers = 0  # Basic.Ack and Basic.Nack frames received: progress, for the timer
        self._nacked: list[int] = []
        self._methods: dict[tuple[str, str], bytes] = {}
        self._body_max: int = self._impl.connection._body_max_length
        selected: list[pika.frame.Method] = []
        with answer_within(connection, timeout):
            self._impl.confirm_delivery(ack_nack_callback=self._on_answer, callback=selected.append)
            channel._flush_output(lambda: bool(selected))

    @property
    def unconfirmed(self) -> int:
        """Messages published and not yet acknowledged."""
        return self.published - self.confirmed - len(self._acked_above)

    def publish_all(self, exchange: str, messages: Iterable[Message], *, window: int | None = None) -> None:
        """Publish ``messages`` in order to ``exchange``, at most ``window`` of them unconfirmed at a time
        (None: all of them), and return once every one is acknowledged (see the module docstring)."""
        written: list[bytes] = []
        for routing_key, body, properties in messages:
            if window is not None and self.unconfirmed >= window:
                self._write(written)
                self._wait(lambda: self.unconfirmed < window)
            written.append(self._frames(exchange, routing_key, body, properties))
            self.published += 1
            if len(written) >= WRITE_CHUNK:
                self._write(written)
                self._flush()
        self._write(written)
        self._wait(lambda: self.unconfirmed == 0)

    def _frames(
        self, exchange: str, routing_key: str, body: bytes, properties: pika.BasicProperties
    ) -> bytes:
        """One message's frames, marshalled as ``Channel.basic_publish`` would (the method frame, the same
        for every message of a routing key, once)."""
        channel = self._impl.channel_number
        method = self._methods.get((exchange, routing_key))
        if method is None:
            publish = pika.spec.Basic.Publish(exchange=exchange, routing_key=routing_key)
            method = self._methods[(exchange, routing_key)] = pika.frame.Method(channel, publish).marshal()
        frames = [method, pika.frame.Header(channel, len(body), properties).marshal()]
        step = self._body_max
        frames.extend(
            pika.frame.Body(channel, body[i : i + step]).marshal() for i in range(0, len(body), step)
        )
        return b"".join(frames)

    def _write(self, written: list[bytes]) -> None:
        """Hand the messages' frames to the connection in one piece (pika writes each frame of
        ``basic_publish`` with a system call of its own: three a message)."""
        if not written:
            return
        if not self._impl.is_open:
            raise pika.exceptions.ChannelWrongStateError("the channel closed")
        self._impl.connection._output_marshaled_frames([b"".join(written)])
        written.clear()

    def _flush(self) -> None:
        """Send what was written, reading any answers meanwhile, within the timeout."""
        with answer_within(self._connection, self._timeout):
            self._channel._flush_output()

    def _wait(self, done: Callable[[], bool]) -> None:
        """Read answers until ``done``, each wait for the next one bounded by the timeout."""
        while True:
            if self._nacked:
                raise Nacked(f"RabbitMQ refused {len(self._nacked)} message(s), first tag {self._nacked[0]}")
            if done():
                return
            with answer_within(self._connection, self._timeout):
                self._channel._flush_output(lambda seen=self._answers: self._answers != seen)

    def _on_answer(self, frame: pika.frame.Method) -> None:
        method = frame.method
        self._answers += 1
        if isinstance(method, pika.spec.Basic.Nack):
            self._nacked.append(method.delivery_tag)
            return
        tag = method.delivery_tag
        if method.multiple:
            self.confirmed = max(self.confirmed, tag or self.published)  # tag 0: every one so far
            self._acked_above = {t for t in self._acked_above if t > self.confirmed}
        else:
            self._acked_above.add(tag)
        while self.confirmed + 1 in self._acked_above:
            self.confirmed += 1
            self._acked_above.discard(self.confirmed)
