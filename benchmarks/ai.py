"""`make bench-ai`: AI steps through a model that takes 500 ms per answer, with one ai_steps process.

Seeds N contacts (400 by default), each enrolled in a one-step AI sequence and due now, and starts the
local OpenAI-compatible model server (``followups.model_server``) answering after LATENCY (0.5 s). The
release path runs its first pass (each AI step leased, as ``followups worker release`` does with
``AI_BASE_URL`` set) and hands each leased step to a pool of C threads (``AI_CONCURRENCY``, 32 here), as
the ai_steps service does: each calls the model holding no lock, then runs the fenced second pass. steps/s
= N / the time until every step was queued; the ideal is C / LATENCY (every thread always waiting on the
model).

With ``--local-model`` the same again against a real model on this machine (``followups.local_model``:
llama.cpp's server with SmolLM2-135M, the ``local-model`` extra), with ``--local-steps`` steps (20) at
``--local-concurrency`` (4): the draft or the fallback, as the model and the judge decide.

The last line is `ai: steps_per_s=<n> concurrency=<c> ideal_per_s=<n>`; with ``--local-model`` it is
followed by `ai: steps_per_s=<n> concurrency=<c> drafted=<n>/<n> model=smollm2-135m`.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import psycopg

from benchmarks.common import bench_database
from benchmarks.seed import seed_due_enrollments
from followups import local_model
from followups.model_server import model_server
from libs.common.ai.client import ModelClient
from libs.common.ai.step import StepDue, run_step
from libs.common.core.clock import SYSTEM_CLOCK
from libs.common.core.db import create_pool
from libs.common.core.settings import AiSettings, DatabaseSettings, FollowupSettings
from libs.common.followups.definition import AiStep, Definition, TemplateFallback
from libs.common.followups.release_step import Released
from libs.common.followups.sequences import SequenceCreate, create_sequence, publish_sequence
from libs.common.platform.projects import create_project
from services.release.release import release_batch

BENCH_DATABASE = "followups_bench_ai"


@dataclass(frozen=True)
class Run:
    steps: int
    elapsed: float
    drafted: int

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.elapsed


def run(ai: AiSettings, steps: int) -> Run:
    """``steps`` AI steps due now, leased and written through the model of ``ai``, until all are queued."""
    with bench_database(BENCH_DATABASE) as url:
        with psycopg.connect(url) as conn:
            project_id = create_project(conn, "bench").project_id
            step = AiStep(
                goal="Find out whether the customer read the quote",
                instructions="Ask whether the quote suited them",
                fallback=TemplateFallback(text="Hello, still interested?"),
            )
            sequence = create_sequence(
                conn, project_id, SequenceCreate(name="ai", definition=Definition(steps=[step]))
            )
            publish_sequence(conn, project_id, sequence.id)
            seed_due_enrollments(conn, project_id, sequence.id, steps, due_at=datetime.now(UTC))
        pool = create_pool(DatabaseSettings(url=url, pool_min_size=2, pool_max_size=ai.concurrency + 4))
        client = ModelClient(ai)
        settings = FollowupSettings()
        calls = ThreadPoolExecutor(max_workers=ai.concurrency)
        futures = []

        def leased(released: Released) -> None:
            assert released.project_id and released.fence is not None and released.step_index is not None
            due = StepDue(released.project_id, released.enrollment_id, released.step_index, released.fence)
            futures.append(calls.submit(run_step, pool, SYSTEM_CLOCK, client, settings, due))

        started = time.perf_counter()
        lease = timedelta(minutes=5)
        while release_batch(pool, SYSTEM_CLOCK, settings, limit=1000, ai_lease=lease, on_lease=leased):
            pass
        for future in futures:
            future.result()
        elapsed = time.perf_counter() - started
        with psycopg.connect(url) as conn:
            queued = conn.execute(
                "SELECT count(*), count(*) FILTER (WHERE reason IS NULL) FROM followup_step_runs"
                " WHERE outcome = 'queued'"
            ).fetchone()
        assert queued is not None and queued[0] == steps, f"{queued} of {steps} queued"
        calls.shutdown()
        client.close()
        pool.close()
    return Run(steps, elapsed, queued[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("-n", "--steps", type=int, default=400)
    parser.add_argument("-c", "--concurrency", type=int, default=32)
    parser.add_argument("--latency", type=float, default=0.5, help="seconds the model takes per answer")
    parser.add_argument("--local-model", action="store_true", help="also against SmolLM2 (llama.cpp)")
    parser.add_argument("--local-steps", type=int, default=20)
    parser.add_argument("--local-concurrency", type=int, default=4)
    args = parser.parse_args()
    if args.local_model and (problem := local_model.missing()) is not None:
        sys.exit(f"bench-ai --local-model: {problem}")

    print(
        f"ai benchmark: {args.steps} AI steps, model latency {args.latency} s, concurrency {args.concurrency}"
    )
    with model_server() as server:
        server.latency = args.latency
        ai = AiSettings(
            base_url=server.base_url, timeout_seconds=10 * args.latency + 5, concurrency=args.concurrency
        )
        fake = run(ai, args.steps)
    ideal = args.concurrency / args.latency
    print(
        f"  {fake.steps} steps in {fake.elapsed:.1f} s: {fake.steps_per_s:.1f} steps/s"
        f" ({fake.drafted} drafted by the model), most calls at once at the server: {server.max_in_flight};"
        f" ideal {ideal:.0f}/s"
    )
    print(f"ai: steps_per_s={fake.steps_per_s:.1f} concurrency={args.concurrency} ideal_per_s={ideal:.0f}")
    if not args.local_model:
        return

    print(f"ai benchmark: {args.local_steps} AI steps, {local_model.MODEL_NAME} (llama.cpp on this machine)")
    with local_model.local_model() as model:
        ai = model.ai_settings(AiSettings(timeout_seconds=120, concurrency=args.local_concurrency))
        real = run(ai, args.local_steps)
    print(
        f"  {real.steps} steps in {real.elapsed:.1f} s: {real.steps_per_s:.2f} steps/s,"
        f" {real.elapsed / real.steps:.2f} s per step; {real.drafted} drafted by the model, the others fell"
        " back"
    )
    print(
        f"ai: steps_per_s={real.steps_per_s:.2f} concurrency={args.local_concurrency}"
        f" drafted={real.drafted}/{real.steps} model={local_model.MODEL_NAME}"
    )


if __name__ == "__main__":
    main()
