"""`make bench-triggers`: rule matching throughput and event-to-action latency.

Seeds one project with C contacts (100,000 by default), each with an open conversation, tags and
attributes, and R active rules (50 by default) over five events (message.created, conversation.updated,
contact.tag_added, contact.updated, lead.created) with conditions of every shape (keywords, tags, typed
attributes, nested any/all groups) and cheap actions (a label, a tag, a private note).

1. Throughput, for R rounds (``--rounds``, 3): N mixed events (20,000 by default) go through the real event
   path (``apply_event`` and the contact functions of ``libs.common.ingress``, which record the triggers in
   the event's transaction); then W worker processes run the triggers service's batch
   (``process_triggers``) until every trigger is processed. events/s = N / time to drain; matched/s = rule
   runs that executed in the round / the same time; each the median of the rounds (one drain moves by
   15 % from run to run on a shared 2-core machine). The database is vacuumed between rounds, untimed, as
   autovacuum would meanwhile: on a server with autovacuum off, each round was slower than the last.
2. Latency: a steady stream of events at E per second (200 by default) for S seconds while the W workers
   run; each worker polls every 5 ms when idle (standing for the nudge a committed event sends over
   RabbitMQ). The event-to-action time of a trigger is its batch's commit time minus the event's time.

3. Noisy neighbour: project B holds the hostile rule set (132 ``contact.created`` rules of 100
   ``attribute_changed`` leaves each, in groups of the most children a group may have: together more
   parameters than one PostgreSQL statement takes) and a backlog of 100,000 recorded triggers of its
   contacts, while the first project's events keep flowing at E per second; W fresh workers run both. They
   compile B's rules in the background first (seconds: a service does it once after it starts, and again
   only for a rule that changes): the first project's event-to-action p99 while they do is the cold start
   (`neighbour_cold_p99_ms`); from when every worker has committed its first batch of B's triggers, for S
   more seconds, it is `neighbour_p99_ms`.

``--profile``: afterwards, ``--profile-events`` (5,000) more events are recorded and drained by W workers
under cProfile; the 15 heaviest functions of their merged profile (by cumulative time) are printed. The
figures are the unprofiled runs' only.

The last line is `triggers: events_per_s=<n> matched_per_s=<n> p99_ms_event_to_action=<n>
neighbour_p99_ms=<n> neighbour_cold_p99_ms=<n> worker_cpu_ms_per_event=<ms> backend_cpu_ms_per_event=<ms>`:
the last two are the CPU an event of the throughput rounds cost the workers and their database backends
(medians of the rounds; -1 for backends not on this machine): they leave out the time a process waited
for a core, which the rates count.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import math
import multiprocessing
import os
import pstats
import random
import statistics
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import msgspec
import psycopg

from benchmarks.common import CpuUsed, bench_database, percentile, start_all
from libs.common.contracts.limits import MAX_GROUP_CHILDREN
from libs.common.contracts.platform_events import ConversationUpdated, InboundMessage, LeadCreated
from libs.common.core.clock import SYSTEM_CLOCK
from libs.common.core.db import create_pool
from libs.common.core.settings import DatabaseSettings
from libs.common.ingress import apply_event, contact_changes
from libs.common.platform.contacts import ContactUpdate
from libs.common.platform.projects import create_project
from libs.common.rules.rules import RuleCreate, create_rule
from libs.common.rules.triggers import process_triggers

BENCH_DATABASE = "followups_bench_triggers"

KEYWORDS = ["stop", "price", "hello", "refund", "thanks", "book", "cancel", "help"]
TAGS = ["vip", "lead", "churn-risk", "newsletter", "trial", "paid"]
LABELS = ["billing", "sales", "support", "urgent-review"]


def _rules(count: int) -> list[dict[str, Any]]:
    """``count`` rules over five events, conditions of every shape, cheap actions; selective, as real
    automations are (about one event in four runs a rule)."""
    vip = {"attribute": "contact.tags", "operator": "contains", "value": "vip"}
    shapes: list[tuple[str, dict[str, Any]]] = []
    for i, word in enumerate(KEYWORDS):
        shapes.append(
            (
                "message.created",
                {
                    "all": [
                        {"attribute": "message.type", "operator": "equal_to", "value": "incoming"},
                        {"attribute": "message.content", "operator": "contains", "value": word},
                        vip,
                        {
                            "attribute": "contact.attributes.score",
                            "operator": "is_greater_than",
                            "value": 40 + i,
                        },
                    ]
                },
            )
        )
    for label in LABELS:
        shapes.append(
            (
                "conversation.updated",
                {
                    "all": [
                        {
                            "attribute": "conversation.priority",
                            "operator": "attribute_changed",
                            "value": {"to": "high"},
                        },
                        {
                            "any": [
                                {"attribute": "conversation.labels", "operator": "contains", "value": label},
                                {
                                    "attribute": "contact.attributes.plan",
                                    "operator": "equal_to",
                                    "value": "gold",
                                },
                            ]
                        },
                        vip,
                    ]
                },
            )
        )
    for tag in TAGS:
        shapes.append(
            (
                "contact.tag_added",
                {
                    "all": [
                        {"attribute": "changed", "operator": "contains", "value": "contact.tags"},
                        {"attribute": "contact.tags", "operator": "contains", "value": tag},
                        {"attribute": "contact.attributes.plan", "operator": "in", "value": ["gold"]},
                        {"attribute": "contact.opted_out", "operator": "equal_to", "value": False},
                    ]
                },
            )
        )
    for bound in (85, 90, 95):
        shapes.append(
            (
                "contact.updated",
                {
                    "all": [
                        {"attribute": "changed", "operator": "contains", "value": "contact.attributes.score"},
                        {
                            "attribute": "contact.attributes.score",
                            "operator": "is_greater_than",
                            "value": bound,
                        },
                    ]
                },
            )
        )
    shapes.append(
        (
            "lead.created",
            {"all": [{"attribute": "lead.status", "operator": "equal_to", "value": "open"}, vip]},
        )
    )
    actions = [
        {"type": "add_label", "labels": ["auto"]},
        {"type": "add_contact_tag", "tags": ["touched"]},
        {"type": "add_private_note", "text": "matched by a rule"},
    ]
    return [
        {
            "name": f"rule {i}",
            "event": shapes[i % len(shapes)][0],
            "conditions": shapes[i % len(shapes)][1],
            "actions": [actions[i % len(actions)]],
        }
        for i in range(count)
    ]


def _seed(url: str, contacts: int, rules: int) -> uuid.UUID:
    with psycopg.connect(url) as conn:
        project_id = create_project(conn, "bench").project_id
        conn.execute(
            """
            INSERT INTO contacts (project_id, phone, name, tags, attributes)
            SELECT %(project_id)s, '+1' || lpad((3000000000 + g)::text, 10, '0'), 'Contact ' || g,
                   ARRAY[(ARRAY['vip', 'lead', 'trial', 'paid'])[1 + g %% 4]],
                   jsonb_build_object('score', g %% 100,
                                      'plan', (ARRAY['gold', 'silver', 'free'])[1 + g %% 3])
            FROM generate_series(1, %(count)s) AS g
            """,
            {"project_id": project_id, "count": contacts},
        )
        conn.execute(
            "INSERT INTO conversations (project_id, contact_id) SELECT project_id, id FROM contacts"
            " WHERE project_id = %s",
            (project_id,),
        )
        now = datetime.now(UTC)
        for rule in _rules(rules):
            create_rule(conn, project_id, msgspec.convert(rule, RuleCreate), now=now)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
    return project_id


#: The noisy neighbour: rules, leaves per rule, recorded triggers of its backlog, contacts they are about.
HOSTILE_RULES = 132
HOSTILE_LEAVES = 100
BACKLOG = 100_000
NEIGHBOUR_CONTACTS = 1_000


def _hostile_conditions() -> dict[str, Any]:
    """``HOSTILE_LEAVES`` attribute_changed leaves (from and to: five parameters each), in groups of the
    most children a group may have."""
    leaves = [
        {
            "attribute": f"contact.attributes.k{i}",
            "operator": "attribute_changed",
            "value": {"from": i, "to": i},
        }
        for i in range(HOSTILE_LEAVES)
    ]
    step = MAX_GROUP_CHILDREN
    return {"any": [{"all": leaves[i : i + step]} for i in range(0, len(leaves), step)]}


def _seed_neighbour(url: str) -> uuid.UUID:
    """Project B: its hostile rules (saved through the domain, within its limits) and its backlog."""
    with psycopg.connect(url) as conn:
        project_id = create_project(conn, "noisy neighbour").project_id
        now = datetime.now(UTC)
        conditions = _hostile_conditions()
        for i in range(HOSTILE_RULES):
            rule = {
                "name": f"hostile {i}",
                "event": "contact.created",
                "conditions": conditions,
                "actions": [{"type": "add_contact_tag", "tags": ["hostile"]}],
            }
            create_rule(conn, project_id, msgspec.convert(rule, RuleCreate), now=now)
        conn.execute(
            "INSERT INTO contacts (project_id, phone, name)"
            " SELECT %s, '+1' || lpad((5000000000 + g)::text, 10, '0'), 'Neighbour ' || g"
            " FROM generate_series(1, %s) AS g",
            (project_id, NEIGHBOUR_CONTACTS),
        )
        conn.execute(
            """
            INSERT INTO followup_triggers (project_id, type, contact_id, payload, occurred_at,
                                           next_attempt_at)
            SELECT %(project_id)s, 'contact.created', c.id, '{}', %(now)s, %(now)s
            FROM generate_series(1, %(backlog)s) AS g
            JOIN (SELECT id, row_number() OVER (ORDER BY id) - 1 AS n FROM contacts
                  WHERE project_id = %(project_id)s) c ON c.n = g %% %(contacts)s
            """,
            {"project_id": project_id, "now": now, "backlog": BACKLOG, "contacts": NEIGHBOUR_CONTACTS},
        )
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE followup_triggers")
        conn.execute("VACUUM ANALYZE contacts")
    return project_id


class _Producer:
    """Mixed events through the real event path, each in a transaction of its own."""

    def __init__(self, url: str, project_id: uuid.UUID, seed: int) -> None:
        self.pool = create_pool(DatabaseSettings(url=url, pool_min_size=1, pool_max_size=1))
        self.project_id = project_id
        self.random = random.Random(seed)
        with self.pool.connection() as conn:
            self.contacts = [
                row
                for row in conn.execute(
                    "SELECT c.id, v.id FROM contacts c JOIN conversations v ON v.contact_id = c.id"
                    " WHERE c.project_id = %s",
                    (project_id,),
                )
            ]

    def one(self) -> None:
        contact_id, conversation_id = self.random.choice(self.contacts)
        kind = self.random.random()
        now = datetime.now(UTC)
        with self.pool.connection() as conn:
            if kind < 0.4:
                words = " ".join(self.random.choices(KEYWORDS, k=2))
                event: Any = InboundMessage(
                    provider_message_id=uuid.uuid4().hex,
                    contact_id=contact_id,
                    conversation_id=conversation_id,
                    body=f"Hi, {words}?",
                )
                apply_event(conn, self.project_id, event, now=now)
            elif kind < 0.65:
                event = ConversationUpdated(
                    conversation_id=conversation_id,
                    labels=self.random.sample(LABELS, 1),
                    priority=self.random.choice(["low", "high"]),
                )
                apply_event(conn, self.project_id, event, now=now)
            elif kind < 0.85:
                contact_changes.change_tags(
                    conn,
                    self.project_id,
                    contact_id,
                    add=[f"t{self.random.randrange(1000)}", self.random.choice(TAGS)],
                    now=now,
                )
            elif kind < 0.97:
                update = ContactUpdate(attributes={"score": self.random.randrange(100)})
                contact_changes.update_contact(conn, self.project_id, contact_id, update, now=now)
            else:
                apply_event(conn, self.project_id, LeadCreated(contact_id=contact_id), now=now)

    def close(self) -> None:
        self.pool.close()


def _worker(
    url: str, ready: Any, go: Any, stop: Any, results: Any, idle_exit: bool, profile: str | None
) -> None:
    pool = create_pool(DatabaseSettings(url=url, pool_min_size=1, pool_max_size=1))
    used = CpuUsed(pool)
    ready.release()
    go.wait()
    used.start()
    profiler = cProfile.Profile() if profile is not None else None
    if profiler is not None:
        profiler.enable()
    finished: list[tuple[int, float]] = []
    while not stop.is_set():
        processed = process_triggers(pool, SYSTEM_CLOCK, limit=100)
        committed = time.time()
        finished += [(trigger_id, committed) for trigger_id in processed.trigger_ids]
        if processed.triggers == 0:
            if idle_exit:
                break
            time.sleep(0.005)
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(f"{profile}.{os.getpid()}")
    results.put((finished, *used.seconds()))
    pool.close()


def _run_workers(
    url: str,
    workers: int,
    *,
    idle_exit: bool,
    during: Any = None,
    by_worker: list[Any] | None = None,
    profile: str | None = None,
    cpu: list[float] | None = None,
) -> tuple[float, list[tuple[int, float]]]:
    """Run ``workers`` worker processes until they find nothing to do (``idle_exit``) or ``during`` has
    returned; with ``profile``, each dumps its cProfile stats to ``<profile>.<pid>``; ``cpu`` receives the
    CPU seconds the workers used and their database backends used (-1: a backend not on this machine)."""
    context = multiprocessing.get_context("spawn")
    ready, go, stop, results = context.Semaphore(0), context.Event(), context.Event(), context.Queue()
    processes = [
        context.Process(target=_worker, args=(url, ready, go, stop, results, idle_exit, profile))
        for _ in range(workers)
    ]
    start_all(processes, ready)
    started = time.perf_counter()
    go.set()
    if during is not None:
        during()
        time.sleep(1.0)  # the last events' triggers
        stop.set()
    reported = [results.get() for _ in processes]
    lists = [items for items, _, _ in reported]
    if cpu is not None:
        backends = [used for _, _, used in reported]
        cpu += [sum(own for _, own, _ in reported), sum(backends) if min(backends) >= 0 else -1.0]
    if by_worker is not None:
        by_worker += lists
    finished = [item for items in lists for item in items]
    for process in processes:
        process.join()
    return time.perf_counter() - started, finished


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("-c", "--contacts", type=int, default=100_000)
    parser.add_argument("-r", "--rules", type=int, default=50)
    parser.add_argument("-n", "--events", type=int, default=20_000)
    parser.add_argument("-w", "--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="throughput rounds (record, then drain)")
    parser.add_argument("--rate", type=int, default=200, help="events per second of the steady stream")
    parser.add_argument("--seconds", type=int, default=15, help="length of the steady stream")
    parser.add_argument(
        "--neighbour-seconds", type=int, default=15, help="length of the stream beside the noisy neighbour"
    )
    parser.add_argument("--profile", action="store_true", help="profile a further drain (cProfile)")
    parser.add_argument("--profile-events", type=int, default=5_000, help="events of the profiled drain")
    args = parser.parse_args()

    print(
        f"triggers benchmark: {args.contacts} contacts, {args.rules} rules, {args.workers} worker processes"
    )
    with bench_database(BENCH_DATABASE) as url:
        project_id = _seed(url, args.contacts, args.rules)
        producer = _Producer(url, project_id, seed=1)
        rates: list[tuple[float, float, float, float]] = []
        for round_ in range(1, args.rounds + 1):
            rates.append(_drain_round(url, producer, args.events, args.workers, round_))
        events_per_s = statistics.median(rate[0] for rate in rates)
        matched_per_s = statistics.median(rate[1] for rate in rates)
        worker_ms = statistics.median(rate[2] for rate in rates)
        backend_ms = statistics.median(rate[3] for rate in rates)
        print(
            f"  drains: {events_per_s:.0f} events/s, {matched_per_s:.0f} rule runs/s,"
            f" medians of {args.rounds}"
        )
        if args.profile:
            _profile(url, producer, args.profile_events, args.workers)

        with psycopg.connect(url) as conn:
            first_new = conn.execute("SELECT coalesce(max(id), 0) + 1 FROM followup_triggers").fetchone()[0]  # type: ignore[index]

        producer_thread = threading.Thread(target=_stream, args=(producer, args.rate, args.seconds))

        def during() -> None:
            producer_thread.start()
            producer_thread.join()

        _, finished = _run_workers(url, args.workers, idle_exit=False, during=during)
        producer.close()
        latencies = _latencies(url, finished, first_new, None)
        p50, p99 = statistics.median(latencies), percentile(latencies, 99)
        print(
            f"  steady {args.rate} events/s for {args.seconds} s: {len(latencies)} triggers, event to action"
            f" p50 {p50:.0f} ms, p99 {p99:.0f} ms"
        )
        neighbour_p99, cold_p99 = _neighbour(url, project_id, args)
    print(
        f"triggers: events_per_s={events_per_s:.0f} matched_per_s={matched_per_s:.0f}"
        f" p99_ms_event_to_action={p99:.0f} neighbour_p99_ms={neighbour_p99:.0f}"
        f" neighbour_cold_p99_ms={cold_p99:.0f} worker_cpu_ms_per_event={worker_ms:.3f}"
        f" backend_cpu_ms_per_event={backend_ms:.3f}"
    )


def _executed(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM rule_runs WHERE outcome = 'executed'").fetchone()
    assert row is not None
    return int(row[0])


def _drain_round(
    url: str, producer: _Producer, events: int, workers: int, round_: int
) -> tuple[float, float, float, float]:
    """One throughput round: ``events`` events recorded through the real event path, then drained by
    ``workers`` worker processes: (events/s, rule runs executed/s) over the drain, and the CPU an event cost
    the workers and their backends (ms; -1: the backends are not on this machine), which leaves out the time
    a process waited for a core."""
    executed_before = _executed(url)
    started = time.perf_counter()
    for _ in range(events):
        producer.one()
    recorded_s = time.perf_counter() - started
    cpu: list[float] = []
    elapsed, _ = _run_workers(url, workers, idle_exit=True, cpu=cpu)
    worker_ms, backend_ms = cpu[0] * 1000 / events, cpu[1] * 1000 / events if cpu[1] >= 0 else -1.0
    with psycopg.connect(url) as conn:
        left = conn.execute("SELECT count(*) FROM followup_triggers WHERE processed_at IS NULL").fetchone()
    assert left is not None and left[0] == 0, f"{left} triggers left unprocessed"
    executed = _executed(url) - executed_before
    vacuumed_s = _vacuum(url)
    print(
        f"  round {round_}: {events} events recorded in {recorded_s:.1f} s, drained in {elapsed:.2f} s:"
        f" {events / elapsed:.0f} events/s, {executed / elapsed:.0f} rule runs/s, CPU an event: workers"
        f" {worker_ms:.3f} ms, backends {backend_ms:.3f} ms (then vacuumed in {vacuumed_s:.1f} s)"
    )
    return events / elapsed, executed / elapsed, worker_ms, backend_ms


def _vacuum(url: str) -> float:
    """Vacuum and analyse the database between rounds, untimed: what autovacuum does meanwhile in production
    (migration 0033 vacuums the triggers after 1 % of them changed). A server with autovacuum off (a CI
    server's setting) otherwise carries every round's dead triggers, contacts and conversations into the
    next one, and each round records and drains slower than the last. Returns the seconds it took."""
    started = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM (ANALYZE)")
    return time.perf_counter() - started


def _profile(url: str, producer: _Producer, events: int, workers: int) -> None:
    """Record ``events`` more events, drain them with ``workers`` profiled workers and print the 15
    heaviest functions of their merged profile, by cumulative time."""
    for _ in range(events):
        producer.one()
    with tempfile.TemporaryDirectory() as directory:
        prefix = os.path.join(directory, "worker")
        elapsed, _ = _run_workers(url, workers, idle_exit=True, profile=prefix)
        dumps = [os.path.join(directory, name) for name in os.listdir(directory)]
        out = io.StringIO()
        stats = pstats.Stats(*dumps, stream=out)
    stats.sort_stats("cumulative").print_stats(15)
    rate = events / elapsed
    print(f"  profiled drain: {events} events in {elapsed:.2f} s ({rate:.0f} events/s under cProfile)")
    print("  cProfile of the workers, 15 heaviest by cumulative time:")
    print("\n".join("    " + line for line in out.getvalue().splitlines() if line.strip()))


def _occurred(url: str, first_new: int, project_id: uuid.UUID | None) -> list[tuple[int, float]]:
    """Each trigger from ``first_new`` on (of ``project_id``: None, any) with its event's time."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT id, extract(epoch FROM occurred_at) FROM followup_triggers"
            " WHERE id >= %s AND (%s::uuid IS NULL OR project_id = %s::uuid)",
            (first_new, project_id, project_id),
        ).fetchall()
    return [(i, float(at)) for i, at in rows]


def _latencies(
    url: str, finished: list[tuple[int, float]], first_new: int, project_id: uuid.UUID | None
) -> list[float]:
    """Event to action (ms) of every trigger from ``first_new`` on (of ``project_id``: None, any)."""
    committed = dict(finished)
    occurred = _occurred(url, first_new, project_id)
    latencies = [(committed[i] - at) * 1000 for i, at in occurred if i in committed]
    assert len(latencies) == len(occurred), f"{len(occurred) - len(latencies)} triggers not processed"
    return latencies


def _stream(producer: _Producer, rate: int, seconds: int) -> None:
    """``rate`` events a second for ``seconds`` seconds."""
    interval = 1.0 / rate
    next_at = time.perf_counter()
    for _ in range(rate * seconds):
        producer.one()
        next_at += interval
        time.sleep(max(0.0, next_at - time.perf_counter()))


#: How long the stream beside the neighbour runs before its measured part at most: the workers start cold
#: and compile B's rules meanwhile (in the background: what a service does once after it starts).
WARM_UP_SECONDS = 10


def _neighbour(url: str, project_id: uuid.UUID, args: argparse.Namespace) -> tuple[float, float]:
    """Phase 3: the first project's event-to-action p99 while project B's hostile rules and backlog run,
    once every worker has compiled B's rules (its first batch of B's triggers committed), and while they
    compiled them (the cold start)."""
    neighbour = _seed_neighbour(url)
    with psycopg.connect(url) as conn:
        first_new = conn.execute("SELECT coalesce(max(id), 0) + 1 FROM followup_triggers").fetchone()[0]  # type: ignore[index]
    producer = _Producer(url, project_id, seed=2)

    def during() -> None:
        _stream(producer, args.rate, WARM_UP_SECONDS + args.neighbour_seconds)
        deadline = time.perf_counter() + 30
        with psycopg.connect(url, autocommit=True) as conn:
            while time.perf_counter() < deadline:  # until the first project's last triggers are acted on
                left = conn.execute(
                    "SELECT count(*) FROM followup_triggers WHERE project_id = %s AND id >= %s"
                    " AND processed_at IS NULL",
                    (project_id, first_new),
                ).fetchone()
                if left is not None and left[0] == 0:
                    break
                time.sleep(0.05)

    by_worker: list[list[tuple[int, float]]] = []
    _, finished = _run_workers(url, args.workers, idle_exit=False, during=during, by_worker=by_worker)
    producer.close()
    # warm: from when the last worker committed its first batch of B's triggers (B's are the older ids)
    warm_from = max(min((at for i, at in items if i < first_new), default=math.inf) for items in by_worker)
    occurred = _occurred(url, first_new, project_id)
    committed = dict(finished)
    cold = [(committed[i] - at) * 1000 for i, at in occurred if at < warm_from]
    warm = [(committed[i] - at) * 1000 for i, at in occurred if at >= warm_from]
    with psycopg.connect(url) as conn:
        drained = conn.execute(
            "SELECT count(*) FROM followup_triggers WHERE project_id = %s AND processed_at IS NOT NULL",
            (neighbour,),
        ).fetchone()
    p50, p99 = statistics.median(warm), percentile(warm, 99)
    cold_p99 = percentile(cold, 99) if cold else 0.0
    print(
        f"  beside a neighbour ({HOSTILE_RULES} rules of {HOSTILE_LEAVES} leaves, {BACKLOG} triggers backlog,"
        f" {drained[0] if drained else 0} of them drained meanwhile), {args.rate} events/s: while the workers"
        f" compiled B's rules (cold start) {len(cold)} triggers, p99 {cold_p99:.0f} ms; then {len(warm)}"
        f" triggers, event to action p50 {p50:.0f} ms, p99 {p99:.0f} ms"
    )
    return p99, cold_p99


if __name__ == "__main__":
    main()
