"""`make chaos`: the replicated topology on this machine, under a steady load, with faults on a schedule.

It starts a 3-node RabbitMQ cluster (:mod:`benchmarks.rabbitmq_cluster`: quorum queues, the default),
etcd and Patroni with two PostgreSQL nodes, a primary and a synchronous standby (:mod:`benchmarks.patroni`),
and replicas of the services, each ``followups api`` / ``followups worker <service>`` in a process of its
own: 2 API, 3 release, 2 triggers, 2 ingress, 2 ai_steps, 2 retention (``--replicas`` changes the counts);
the ai_steps replicas write with the local model server (:mod:`followups.model_server`, an OpenAI-compatible
HTTP server answering after ``--model-latency`` seconds). Every
process has ``DATABASE_URL`` with both PostgreSQL nodes (``target_session_attrs=read-write``) and
``AMQP_URL`` with the three RabbitMQ nodes. Ports and folders are its own (a temporary folder, removed at
the end): the machine's PostgreSQL on 5432 and RabbitMQ on 5672 are not touched.

The load, through both API processes in turn (a request refused by one, or a connection it drops, goes to
the other): per contact, an upsert by phone, a tag (a ``contact.tag_added`` event: one rule sends a webhook
at once, another a minute later, both to a local receiver), an enrollment in a 3-step sequence (a message at
once, an AI-written message 15 s later, a message 30 s after that; ``dedupe_key``: a retried enrollment is
the same one) and, for some, a reply (``message.inbound``) or an opt-out after a random time, half of them
through the API and half published to the ingress queue (``followups.ingress``, as the messaging platform
feeds it: on a live node, with publisher confirms). A 503 with ``Retry-After`` is retried (it is what an
outage answers); any other 5xx is counted in ``api_5xx_other``.

The faults, one every ``--fault-every`` seconds in turn: kill -9 of a RabbitMQ node (started again 5 s
later: it rejoins the cluster), kill -9 of random replicas (started again at once), kill -9 of the
PostgreSQL primary's node, Patroni and PostgreSQL (Patroni promotes the synchronous standby; the old node,
started again, rejoins as the standby). A fault has healed when an enrollment made after it has its first
message queued and every outbox event recorded until then is published (the outbox relay, an advisory-lock
holder, works again): ``max_recover_s`` is the longest. Each PostgreSQL fault also starts the retention job
just before the kill and again once healed (a ``followup_retention`` message on its queue): the second run
must end well on the new primary (retention, the other advisory-lock holder, resumes).

After the load it waits (at most ``--drain`` seconds) for what is due to be done, then checks from the
database, the receiver and a quorum queue bound to every event:

- ``steps``: step runs that queued a message; each has exactly one message (``doubled``: a step's second
  message); ``lost``: a step due before the drain and not released, a released step without its message,
  an outbox event never published, a webhook delivery not delivered or that never reached the receiver, a
  published event that never reached the queue;
- ``after_reply``: a follow-up message queued after the contact's reply or opt-out was acknowledged (by
  the API), or after it was applied and not cancelled (through the ingress queue: the enrollment's stop);
  an ingress reply or opt-out never applied is ``lost``;
- ``executions_doubled``: a rule's second webhook delivery for one trigger, or a second pending execution
  of one episode;
- ``events_duplicated``: events the queue received more than once (the relay re-publishes at most its
  batch after a crash);
- ``p99_release_lag_ms``: a released step's run time minus its due time.

Last line: ``chaos: faults= steps= lost=0 doubled=0 after_reply=0 executions_doubled=0 api_5xx_other=0
max_recover_s= p99_release_lag_ms= events_duplicated=``. It exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from benchmarks.chaos_parts import Api, EventsQueue, Publisher, Receiver, Replica, healthy
from benchmarks.common import percentile
from benchmarks.patroni import Patroni, installed
from benchmarks.rabbitmq_cluster import RabbitCluster, free_port, rabbitmq_server
from followups.model_server import ModelServer, model_server
from libs.common.contracts import actors
from libs.common.core.migrate import migrate
from libs.common.platform.projects import create_project

REPLICAS = {"api": 2, "release": 3, "triggers": 2, "ingress": 2, "ai_steps": 2, "retention": 2}
SEQUENCE = {
    "steps": [
        {"kind": "message", "text": 'Hi {{contact.name | "there"}}, any questions?'},
        {
            "kind": "ai",
            "instructions": "Ask, in one sentence, whether they would like to book a call.",
            "fallback": {"kind": "template", "text": "Shall we book a call?"},
            "delay_seconds": 15,
        },
        {"kind": "message", "text": "Last call from us", "delay_seconds": 30},
    ],
    "stop_on": {"reply": True, "opt_out": True},
}


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


# --- the run ---------------------------------------------------------------------------------------------


class Chaos:
    def __init__(self, args: argparse.Namespace, folder: Path) -> None:
        self.args = args
        self.folder = folder
        self.rabbit = RabbitCluster(folder / "rabbitmq")
        self.patroni = Patroni(folder / "patroni")
        self.receiver = Receiver()
        #: Whether the receiver serves (its shutdown waits for a serve_forever that never ran otherwise).
        self.serving = False
        self.replicas: list[Replica] = []
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        #: (when, contact id, "reply" | "opt_out"): the replies and opt-outs to come
        self.planned: list[tuple[float, str, str]] = []
        #: when each contact's reply or opt-out was acknowledged by the API (wall clock)
        self.acknowledged: dict[str, datetime] = {}
        #: the replies and opt-outs published to the ingress queue, by contact
        self.published: dict[str, str] = {}
        self.exits = contextlib.ExitStack()
        self.recoveries: list[tuple[str, float]] = []
        self.contacts = 0
        self.failures: list[str] = []

    # setup

    def start(self) -> None:
        t0 = time.monotonic()
        self.rabbit.start()
        log(f"rabbitmq: 3 nodes on {self.rabbit.ports}")
        self.patroni.start()
        log(f"patroni: {self.patroni.cluster()}")
        migrate(self.patroni.url)
        with psycopg.connect(self.patroni.url) as conn:
            project = create_project(conn, "chaos")
        self.project_id = project.project_id
        threading.Thread(target=self.receiver.serve_forever, daemon=True).start()
        self.serving = True
        self.events = EventsQueue(self.rabbit.urls)
        self.events.start()
        self.publisher = Publisher(self.rabbit.urls)
        self.exits.callback(self.publisher.close)
        self.model: ModelServer = self.exits.enter_context(model_server())
        self.model.latency = self.args.model_latency
        if not self.events.declared.wait(30):
            raise RuntimeError("the events queue could not be declared")
        env = {
            "DATABASE_URL": self.patroni.url,
            "AMQP_URL": self.rabbit.amqp_url,
            "LOG_JSON": "true",
            "API_METRICS_PORT": "0",
            "WORKER_METRICS_PORT": "0",
            "WEBHOOK_ALLOWED_NETWORKS": "127.0.0.0/8",
            "API_KEY_REQUESTS_PER_MINUTE": "0",
            "DATABASE_POOL_MAX_SIZE": "6",
            "AI_BASE_URL": self.model.base_url,
            "AI_TIMEOUT_SECONDS": "5",
            # a killed ai_steps replica's step is taken again once its lease ends
            "FOLLOWUP_AI_LEASE_MS": "15000",
        }
        logs = self.folder / "logs"
        logs.mkdir()
        for service, count in self.args.replicas.items():
            self.replicas += [Replica(service, i, env, logs) for i in range(count)]
        for replica in self.replicas:
            replica.start()
        for replica in self.replicas:
            if replica.service == "api":
                self._api_up(replica)
        self.api = Api([r.port for r in self.replicas if r.service == "api"], project.api_key)
        sequence = self.api.call("POST", "/v1/sequences", {"name": "chaos", "definition": SEQUENCE})
        self.api.call("POST", f"/v1/sequences/{sequence['id']}/publish")
        self.sequence_id = sequence["id"]
        hook = {"type": "send_webhook", "url": self.receiver.url}
        event = "contact.tag_added"
        rule = {"name": "at once", "event": event, "actions": [hook]}
        self.rule_now = self.api.call("POST", "/v1/rules", rule)["id"]
        delayed = {"name": "a minute later", "event": event, "actions": [hook], "execution_delay_minutes": 1}
        self.rule_later = self.api.call("POST", "/v1/rules", delayed)["id"]
        log(f"up in {time.monotonic() - t0:.0f}s: {len(self.replicas)} replicas")

    def _api_up(self, replica: Replica, tries: int = 3) -> None:
        """Wait until an API replica answers. One that exited meanwhile is started again on another port:
        the port it was given (free when asked) may have been taken since by another process's outgoing
        connection, an ephemeral port like it."""
        for _ in range(tries):
            deadline = time.monotonic() + 180
            base = f"http://127.0.0.1:{replica.port}"
            while time.monotonic() < deadline:
                if healthy(base):
                    return
                if replica.process is not None and replica.process.poll() is not None:
                    break
                time.sleep(0.3)
            else:
                raise RuntimeError(f"{replica.name} not answering within 180s ({replica.tail()})")
            log(f"{replica.name} exited at start ({replica.tail()}): started again on another port")
            replica.port = free_port()
            replica.start()
        raise RuntimeError(f"{replica.name} could not start ({replica.tail()})")

    def _await(self, predicate: Callable[[], object], what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise RuntimeError(f"no {what} within {timeout}s (logs under {self.folder})")
            time.sleep(0.3)

    # the load

    def journey(self, n: int) -> None:
        phone = f"+1555{n:07d}"
        contact = self.api.call("PUT", f"/v1/contacts/by-phone/{phone}", {"name": f"Chaos {n}"})
        contact_id = str(contact["id"])
        self.api.call("POST", f"/v1/contacts/{contact_id}/tags", {"tags": ["chaos"]})
        enrollment = {"contact_id": contact_id, "sequence_id": self.sequence_id, "dedupe_key": contact_id}
        self.api.call("POST", "/v1/enrollments", enrollment)
        roll = random.random()
        if roll < 0.35:
            with self.lock:
                kind = "opt_out" if roll < 0.05 else "reply"
                heapq.heappush(self.planned, (time.monotonic() + random.uniform(1, 40), contact_id, kind))

    def answer(self, contact_id: str, kind: str) -> None:
        """The contact's reply or opt-out: through the API, or (half of them) published to the ingress
        queue as the messaging platform would."""
        if kind == "reply":
            event = {
                "type": "message.inbound",
                "contact_id": contact_id,
                "provider_message_id": f"chaos-{contact_id}",
                "body": "no thanks",
            }
        else:
            event = {"type": "contact.opted_out", "contact_id": contact_id}
        if random.random() < 0.5:
            payload = {"project_id": str(self.project_id), "event": event}
            self.publisher.send(actors.INGRESS_QUEUE, actors.PLATFORM_EVENT.actor, [payload])
            with self.lock:
                self.published[contact_id] = kind
            return
        self.api.call("POST", "/v1/events", event)
        with self.lock:
            self.acknowledged[contact_id] = datetime.now(UTC)

    def client(self, until: float) -> None:
        interval = self.args.clients / self.args.rate
        next_at = time.monotonic()
        while time.monotonic() < until and not self.stopping.is_set():
            try:
                due = None
                with self.lock:
                    if self.planned and self.planned[0][0] <= time.monotonic():
                        due = heapq.heappop(self.planned)
                if due is not None:
                    self.answer(due[1], due[2])
                    continue
                if time.monotonic() >= next_at:
                    with self.lock:
                        self.contacts += 1
                        n = self.contacts
                    next_at += interval
                    self.journey(n)
                    continue
            except Exception as exc:
                with self.lock:
                    self.failures.append(f"load: {exc}")
            time.sleep(0.02)

    # faults

    def faults(self, until: float) -> None:
        kinds = ["rabbitmq", "replicas", "postgres", "replicas"]
        step = 0
        while not self.stopping.wait(self.args.fault_every) and time.monotonic() < until:
            kind = kinds[step % len(kinds)]
            step += 1
            at = datetime.now(UTC)
            t0 = time.monotonic()
            try:
                what = getattr(self, f"_fault_{kind.replace('-', '_')}")()
                self._healed(at)
                if kind == "postgres":
                    self._retention_resumes()
            except Exception as exc:
                self.failures.append(f"fault {kind}: {exc}")
                continue
            took = time.monotonic() - t0
            self.recoveries.append((what, took))
            log(f"fault {step}: {what}, healed in {took:.1f}s")

    def _fault_rabbitmq(self) -> str:
        index = random.randrange(len(self.rabbit.names))
        self.rabbit.kill(index)
        time.sleep(5)
        self.rabbit.start_node(index)
        self.rabbit.await_node(index)
        return f"kill -9 of rabbitmq node {index}"

    def _fault_replicas(self) -> str:
        chosen = random.sample(self.replicas, random.randint(1, 3))
        for replica in chosen:
            replica.kill()
        time.sleep(1)
        for replica in chosen:
            replica.start()
        return "kill -9 of " + ", ".join(r.name for r in chosen)

    def _fault_postgres(self) -> str:
        old = self.patroni.leader()
        assert old is not None, "no PostgreSQL leader"
        self._start_retention()  # a run cut by the kill, perhaps
        self.patroni.kill(old)
        t0 = time.monotonic()
        self._await(lambda: self.patroni.leader() not in (None, old), "promotion", 90)
        promoted = time.monotonic() - t0
        self.patroni.start_node(old)
        return f"kill -9 of the PostgreSQL primary pg{old} (promoted in {promoted:.0f}s)"

    def _start_retention(self) -> None:
        self.publisher.send(actors.RETENTION_QUEUE, "followup_retention", [])

    def _retention_runs(self) -> int:
        """Retention runs that ended well, as the retention replicas logged them."""
        return sum(
            path.read_text(errors="replace").count('"retention job done"')
            for path in (self.folder / "logs").glob("retention-*.log")
        )

    def _retention_resumes(self) -> None:
        """After a failover, the retention job runs through on the new primary (its advisory lock, held on
        the old one by a run the kill cut, is free there)."""
        before = self._retention_runs()
        self._start_retention()
        self._await(lambda: self._retention_runs() > before, "retention run on the new primary", 120)

    def _healed(self, since: datetime) -> None:
        """Wait until an enrollment made now has its first message queued and every outbox event recorded
        until then is published."""
        n = 9_000_000 + int(time.monotonic() * 10) % 1_000_000  # probe contacts: phones of their own
        deadline = time.monotonic() + 180
        while True:
            try:
                self.journey(n)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        phone = f"+1555{n:07d}"

        def healed() -> bool:
            try:
                with psycopg.connect(self.patroni.url) as conn:
                    row = conn.execute(
                        "SELECT min(m.created_at) FROM messages m JOIN contacts c ON c.id = m.contact_id"
                        " WHERE c.project_id = %s AND m.project_id = %s AND c.phone = %s",
                        (self.project_id, self.project_id, phone),
                    ).fetchone()
                    if row is None or row[0] is None:
                        return False
                    unpublished = conn.execute(
                        "SELECT count(*) FROM outbox WHERE project_id = %s AND published_at IS NULL"
                        " AND occurred_at <= %s",
                        (self.project_id, row[0]),
                    ).fetchone()
                    return unpublished is not None and unpublished[0] == 0
            except psycopg.Error:
                return False

        self._await(healed, "healing", 180)

    # the run and its checks

    def run(self) -> int:
        until = time.monotonic() + self.args.seconds
        threads = [threading.Thread(target=self.client, args=(until,)) for _ in range(self.args.clients)]
        threads.append(threading.Thread(target=self.faults, args=(until,)))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        with self.lock:
            planned, self.planned = self.planned, []
        for _, contact_id, kind in planned:  # what was planned for later happens now
            self.answer(contact_id, kind)
        log(f"load done: {self.contacts} contacts, {self.api.requests} requests; draining")
        return self.check()

    def _rows(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        for _ in range(60):
            try:
                with psycopg.connect(self.patroni.url) as conn:
                    return conn.execute(sql.replace("$P", "%s"), params).fetchall()
            except psycopg.OperationalError:
                time.sleep(1)
        raise RuntimeError("PostgreSQL unreachable for the checks")

    def _count(self, sql: str) -> int:
        [(count,)] = self._rows(sql, *([self.project_id] * sql.count("$P")))
        return int(count or 0)

    def _pending(self) -> dict[str, int]:
        return {
            "due steps": self._count(
                "SELECT count(*) FROM followup_enrollments WHERE project_id = $P AND status = 'active'"
                " AND next_run_at < now() - interval '5 seconds'"
            ),
            "pending executions": self._count(
                "SELECT count(*) FROM rule_pending_executions WHERE project_id = $P AND status = 'pending'"
            ),
            "triggers": self._count(
                "SELECT count(*) FROM followup_triggers WHERE project_id = $P AND processed_at IS NULL"
            ),
            "deliveries": self._count(
                "SELECT count(*) FROM webhook_deliveries WHERE project_id = $P AND status = 'pending'"
            ),
            "outbox": self._count(
                "SELECT count(*) FROM outbox WHERE project_id = $P AND published_at IS NULL"
            ),
        }

    def check(self) -> int:
        deadline = time.monotonic() + self.args.drain
        while True:
            pending = self._pending()
            if not any(pending.values()) and time.monotonic() - self.events.last_at > 3:
                break
            if time.monotonic() > deadline:
                log(f"still pending after the drain: {pending}")
                break
            time.sleep(1)
        pending = self._pending()
        p = self.project_id
        steps = self._count(
            "SELECT count(*) FROM followup_step_runs WHERE project_id = $P AND outcome = 'queued'"
        )
        doubled = self._count(
            "SELECT count(*) FROM (SELECT 1 FROM messages WHERE project_id = $P"
            " AND followup_enrollment_id IS NOT NULL GROUP BY followup_enrollment_id, followup_step_index"
            " HAVING count(*) > 1) d"
        )
        without_message = self._count(
            "SELECT count(*) FROM followup_step_runs r WHERE r.project_id = $P AND r.outcome = 'queued'"
            " AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.project_id = r.project_id"
            " AND m.id = r.message_id)"
        )
        missing_deliveries = self._count(
            "SELECT count(*) FROM followup_triggers t WHERE t.project_id = $P"
            " AND t.type = 'contact.tag_added'"
            " AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.project_id = t.project_id"
            " AND d.trigger_id = t.public_id)"
        )
        delivery_ids = {
            str(i) for (i,) in self._rows("SELECT id FROM webhook_deliveries WHERE project_id = %s", p)
        }
        with self.receiver.lock:
            received = dict(self.receiver.deliveries)
        unreceived = len(delivery_ids - set(received))
        event_ids = {
            str(i)
            for (i,) in self._rows(
                "SELECT event_id FROM outbox WHERE project_id = %s AND published_at IS NOT NULL", p
            )
        }
        events_unreceived = len(event_ids - set(self.events.received))
        events_duplicated = sum(n - 1 for n in self.events.received.values())
        executions_doubled = self._count(
            "SELECT count(*) FROM (SELECT 1 FROM webhook_deliveries WHERE project_id = $P"
            " GROUP BY rule_id, trigger_id HAVING count(*) > 1) d"
        ) + self._count(
            "SELECT count(*) FROM (SELECT 1 FROM rule_pending_executions WHERE project_id = $P"
            " GROUP BY rule_id, episode_key HAVING count(*) > 1) d"
        )
        with self.lock:
            acknowledged = dict(self.acknowledged)
        after_reply = 0
        if acknowledged:
            after_reply = len(
                self._rows(
                    "SELECT m.id FROM messages m JOIN unnest(%s::uuid[], %s::timestamptz[]) a(contact_id, at)"
                    " ON a.contact_id = m.contact_id WHERE m.project_id = %s"
                    " AND m.followup_enrollment_id IS NOT NULL AND m.created_at > a.at",
                    list(acknowledged),
                    list(acknowledged.values()),
                    p,
                )
            )
        with self.lock:
            published = dict(self.published)
        unapplied = after_stop = 0
        if published:
            contacts = list(published)
            kinds = list(published.values())
            # applied: a reply's inbound message is recorded; an opt-out's contact is opted out
            [(unapplied,)] = self._rows(
                "SELECT count(*) FROM unnest(%s::uuid[], %s::text[]) a(contact_id, kind) WHERE CASE a.kind"
                " WHEN 'reply' THEN NOT EXISTS (SELECT 1 FROM messages m WHERE m.project_id = %s"
                " AND m.contact_id = a.contact_id AND m.direction = 'inbound'"
                " AND m.provider_message_id = 'chaos-' || a.contact_id)"
                " ELSE NOT EXISTS (SELECT 1 FROM contacts c WHERE c.project_id = %s AND c.id = a.contact_id"
                " AND c.opted_out_at IS NOT NULL) END",
                contacts,
                kinds,
                p,
                p,
            )
            # once the stop committed, no follow-up of the contact may be queued (and not cancelled)
            [(after_stop,)] = self._rows(
                "SELECT count(*) FROM messages m JOIN followup_enrollments e ON e.project_id = m.project_id"
                " AND e.contact_id = m.contact_id AND e.status = 'stopped'"
                " AND e.reason IN ('replied', 'opted_out')"
                " WHERE m.project_id = %s AND m.contact_id = ANY(%s::uuid[])"
                " AND m.followup_enrollment_id IS NOT NULL AND m.created_at > e.finished_at"
                " AND m.status <> 'CANCELLED'",
                p,
                contacts,
            )
        after_reply += int(after_stop)
        lags = [
            float(ms)
            for (ms,) in self._rows(
                "SELECT extract(epoch FROM ran_at - due_at) * 1000 FROM followup_step_runs"
                " WHERE project_id = %s AND outcome = 'queued'",
                p,
            )
        ]
        lost = (
            pending["due steps"]
            + without_message
            + pending["outbox"]
            + pending["deliveries"]
            + missing_deliveries
            + unreceived
            + events_unreceived
            + int(unapplied)
        )
        log(
            f"details: pending={pending} steps_without_message={without_message}"
            f" tag_triggers_without_delivery={missing_deliveries} deliveries_unreceived={unreceived}"
            f" events_unreceived={events_unreceived} deliveries={len(delivery_ids)} events={len(event_ids)}"
            f" api_requests={self.api.requests} api_503={self.api.unavailable} api_retries={self.api.retried}"
            f" replies_and_opt_outs={len(acknowledged)} through_ingress={len(published)}"
            f" ingress_unapplied={unapplied} ai_calls={self.model.received()}"
        )
        for line in self.api.other_5xx[:10] + self.failures[:10]:
            log(f"problem: {line}")
        max_recover = max((took for _, took in self.recoveries), default=0.0)
        print(
            f"chaos: faults={len(self.recoveries)} steps={steps} lost={lost} doubled={doubled}"
            f" after_reply={after_reply} executions_doubled={executions_doubled}"
            f" api_5xx_other={len(self.api.other_5xx)} max_recover_s={max_recover:.1f}"
            f" p99_release_lag_ms={percentile(lags, 99):.0f} events_duplicated={events_duplicated}",
            flush=True,
        )
        bad = lost or doubled or after_reply or executions_doubled or self.api.other_5xx or self.failures
        return 1 if bad or not steps else 0

    def close(self) -> None:
        self.stopping.set()
        for replica in self.replicas:
            replica.kill()
        if hasattr(self, "events"):
            self.events.stopping.set()
        if self.serving:
            self.receiver.shutdown()
        self.receiver.server_close()
        self.exits.close()
        self.patroni.close()
        self.rabbit.close()


def _interrupted(*_: object) -> None:
    raise KeyboardInterrupt


def _replicas(text: str) -> dict[str, int]:
    counts = dict(REPLICAS)
    for part in filter(None, text.split(",")):
        service, _, count = part.partition("=")
        counts[service.strip()] = int(count)
    return counts


@contextlib.contextmanager
def _folder(keep: bool) -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="followups-chaos-"))
    folder.chmod(0o755)  # Patroni runs as the postgres user when started by root
    try:
        yield folder
    finally:
        if keep:
            log(f"kept {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="chaos", description=__doc__.split("\n")[0] if __doc__ else "")
    parser.add_argument("--seconds", type=float, default=150, help="how long the load and the faults run")
    parser.add_argument("--rate", type=float, default=3, help="new contacts a second")
    parser.add_argument("--clients", type=int, default=4, help="client threads")
    parser.add_argument("--fault-every", type=float, default=15, help="seconds between faults")
    parser.add_argument("--drain", type=float, default=150, help="at most this long to finish what is due")
    parser.add_argument("--replicas", type=_replicas, default=dict(REPLICAS), help="e.g. release=3,api=2")
    parser.add_argument("--model-latency", type=float, default=0.3, help="seconds the model takes per answer")
    parser.add_argument("--keep", action="store_true", help="keep the folder of logs and data")
    args = parser.parse_args(argv)
    missing = installed() or (None if rabbitmq_server() else "RabbitMQ is not installed")
    if missing:
        print(f"chaos: {missing}", file=sys.stderr)
        return 2
    started = time.monotonic()
    signal.signal(signal.SIGTERM, _interrupted)  # stopped: clean up as at the end
    with _folder(args.keep) as folder:
        chaos = Chaos(args, folder)
        try:
            chaos.start()
            code = chaos.run()
        finally:
            chaos.close()
    log(f"took {time.monotonic() - started:.0f}s")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
