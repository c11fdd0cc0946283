"""AI steps against a real model: llama.cpp's OpenAI-compatible server with SmolLM2-135M-Instruct, from the
``local-model`` extra (:mod:`followups.local_model`), started once per test session.

The tier runs when the extra is installed, and always under ``CI`` (where ``make test`` installs it: a
missing extra is a failure there); elsewhere it is skipped with the install hint. A small model writes what
it writes: each test accepts the draft or the step's fallback, and checks what must hold either way (one
message, the outcome recorded, a draft that the judge accepts, the tokens in the ledger). The calls go
through the scripted server (``followups.model_server``) passing them on to the real one: it records every
request and holds calls in flight on demand. The failure modes a real model cannot be made to show on demand
stay in ``tests/test_ai_steps.py`` against the scripted server alone.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import msgspec
import pytest
from psycopg_pool import ConnectionPool

from followups import local_model
from followups.model_server import ModelServer, model_server
from libs.common.ai.client import Answer, ModelClient
from libs.common.ai.judge import judge
from libs.common.ai.step import build_prompt
from libs.common.core.clock import SYSTEM_CLOCK
from libs.common.core.runtime import Runtime
from libs.common.core.settings import AiSettings
from libs.common.followups.definition import AiStep
from tests.conftest import Project
from tests.factories import make_contact, make_enrollment
from tests.helpers import rows, start_worker, stop_all, wait_until
from tests.test_ai_steps import (
    FALLBACK,
    FALLBACK_TEXT,
    ai_sequence,
    enrollment_state,
    lease_one,
    ledger,
    messages_of,
    second_pass,
    step_runs,
)
from tests.test_dev import _box, _free_port, _start

MISSING = local_model.missing()

pytestmark = [
    pytest.mark.skipif(MISSING is not None and not os.environ.get("CI"), reason=f"no local model: {MISSING}"),
    pytest.mark.slow,
]

#: What the real model is asked to write (a goal, so the judge's topic check applies).
STEP = AiStep(
    goal="Find out whether the customer read the quote we sent",
    instructions="Ask Ana, warmly and in one or two sentences, whether she had a chance to read the quote.",
    fallback=FALLBACK,
    min_confidence=0.3,
    language="en",
)
#: The reasons a step's fallback may give here (no budget is set and a model is configured).
FALLBACK_REASONS = {"ai_low_confidence", "ai_invalid_output", "ai_error", "ai_timeout"}
#: What the prompt of a contact named Ana with nothing more holds.
PROMPT_CONTEXT = {"contact_name": "Ana", "contact_attributes": {}, "variables": {}}
#: Long enough for a call queued behind others at the one llama.cpp server (~2 s each on 2 cores).
TIMEOUT_SECONDS = 60.0
#: The kill test's lease: longer than a real call, short enough to wait for.
LEASE_MS = 30_000


@pytest.fixture(scope="session")
def real_model() -> Iterator[local_model.LocalModel]:
    if MISSING is not None:
        pytest.fail(f"CI is set and the local model is missing: {MISSING}")
    with local_model.local_model() as model:
        yield model


@pytest.fixture
def proxy(real_model: local_model.LocalModel) -> Iterator[ModelServer]:
    """The scripted server passing every call on to the real model (recording it, holding it on demand)."""
    with model_server() as server:
        server.upstream = real_model.url
        yield server


def ai_env(db_url: str, amqp_url: str, proxy: ModelServer, **more: str) -> dict[str, str]:
    return {
        "DATABASE_URL": db_url,
        "AMQP_URL": amqp_url,
        "AI_BASE_URL": proxy.base_url,
        "AI_MODEL": local_model.MODEL_NAME,
        "AI_RESPONSE_FORMAT": "json_object",
        "AI_TIMEOUT_SECONDS": str(TIMEOUT_SECONDS),
        "WORKER_POLL_INTERVAL_SECONDS": "0.2",
        "WORKER_IDLE_MAX_SLEEP_SECONDS": "0.5",
    } | more


def proxied(real_model: local_model.LocalModel, proxy: ModelServer) -> AiSettings:
    """The real model's settings (its name, ``json_object``), sent through the proxy."""
    settings = real_model.ai_settings(AiSettings(timeout_seconds=TIMEOUT_SECONDS))
    return msgspec.structs.replace(settings, base_url=proxy.base_url)


def assert_one_message_recorded(pool: ConnectionPool, enrollment_id: uuid.UUID) -> str:
    """Exactly one message for the step: the model's draft (which the judge accepts) or the fallback with
    its reason; returns the outcome (``drafted`` or the fallback reason)."""
    [(body, status, source, index)] = messages_of(pool, enrollment_id)
    assert (status, source, index) == ("QUEUED", "followup", 0)
    [(step_index, run_outcome, reason)] = step_runs(pool, enrollment_id)
    assert (step_index, run_outcome) == (0, "queued")
    if reason is None:
        assert judge(Answer(message=body, confidence=1.0), STEP) is None, body
        return "drafted"
    assert reason.startswith("ai_fallback:") and reason.removeprefix("ai_fallback:") in FALLBACK_REASONS
    assert body == FALLBACK_TEXT
    return str(reason.removeprefix("ai_fallback:"))


def enroll_many(pool: ConnectionPool, project: Project, count: int) -> list[uuid.UUID]:
    """``count`` contacts named Ana, enrolled in the real model's step, due now on the wall clock."""
    sequence = ai_sequence(pool, project.id, STEP)
    return [
        make_enrollment(
            pool, SYSTEM_CLOCK, project.id, sequence, make_contact(pool, project.id, name="Ana")
        ).id
        for _ in range(count)
    ]


def test_an_ai_step_is_written_by_the_real_model_and_sent_once(
    runtime: Runtime, project: Project, proxy: ModelServer, real_model: local_model.LocalModel
) -> None:
    pool = runtime.pool
    sequence = ai_sequence(pool, project.id, STEP)
    enrollment = make_enrollment(
        pool, runtime.clock, project.id, sequence, make_contact(pool, project.id, name="Ana")
    )
    due = lease_one(runtime, enrollment)
    client = ModelClient(proxied(real_model, proxy))
    try:
        released = second_pass(runtime, client, due)
    finally:
        client.close()

    assert released is not None and released.action == "queue"
    outcome = assert_one_message_recorded(pool, enrollment.id)
    print(f"real model outcome: {outcome}: {messages_of(pool, enrollment.id)[0][0]!r}")
    assert enrollment_state(pool, enrollment.id)["status"] == "completed"
    # one real call, its tokens counted by the server, under the outcome it had
    [(kind, prompt_tokens, completion_tokens, tokens, recorded, reference)] = ledger(pool, project.id)
    assert (kind, recorded, reference) == ("followup", outcome, enrollment.id)
    if outcome != "ai_timeout":
        assert prompt_tokens > 0 and completion_tokens > 0 and tokens == prompt_tokens + completion_tokens
    # the schema went as the llama.cpp server takes it, to the model it serves
    [request] = proxy.chat_requests()
    assert request["model"] == local_model.MODEL_NAME
    assert request["response_format"]["type"] == "json_object"
    assert set(request["response_format"]["schema"]["required"]) == {"message", "confidence", "reason"}
    assert "Language: en" in request["messages"][1]["content"]
    assert proxy.answered == [200]


def test_the_real_server_refuses_json_schema_and_is_asked_with_json_object(proxy: ModelServer) -> None:
    """With the default AI_RESPONSE_FORMAT (OpenAI's ``json_schema``) the llama.cpp server answers 500
    naming ``response_format``; the client asks again with ``json_object`` and its schema."""
    settings = AiSettings(
        base_url=proxy.base_url, model=local_model.MODEL_NAME, timeout_seconds=TIMEOUT_SECONDS
    )
    client = ModelClient(settings)
    try:
        called = client.complete(build_prompt(STEP, PROMPT_CONTEXT, []))
    finally:
        client.close()

    assert [r["response_format"]["type"] for r in proxy.chat_requests()] == ["json_schema", "json_object"]
    assert proxy.answered == [500, 200]
    assert called.failure in (None, "ai_invalid_output") and called.completion_tokens > 0


@pytest.mark.rabbitmq
@pytest.mark.timeout(420)
def test_twenty_steps_at_concurrency_four_are_each_sent_once_and_no_lease_expires_twice(
    db_url: str, amqp_url: str, pool: ConnectionPool, project: Project, proxy: ModelServer
) -> None:
    """A release worker leasing 20 AI steps at once (the default 120 s lease) and an ai_steps worker making
    4 calls at once against the one real server, which answers one at a time. On an idle machine every
    call ends within its lease; on a busy one the last steps' leases may run out while they wait their
    turn, and such a step is leased again: its waiting call is then dropped before it reaches the model,
    and the new lease's call ends within it. No lease expires twice, no step is called for more than once
    per lease, and each step sends one message."""
    enrollments = enroll_many(pool, project, 20)
    env = ai_env(db_url, amqp_url, proxy, AI_CONCURRENCY="4", WORKER_THREADS="1")
    workers = [start_worker("release", env), start_worker("ai_steps", env)]
    try:
        wait_until(
            lambda: rows(pool, "SELECT count(*) FROM messages WHERE source = 'followup'")[0][0] >= 20,
            timeout=280,
            interval=0.5,
            what="20 messages queued",
        )
        wait_until(lambda: proxy.in_flight == 0, timeout=60, what="no call in flight")
    finally:
        codes = stop_all(workers)
    assert codes == [0, 0], "\n".join(w.output for w in workers)

    outcomes = [assert_one_message_recorded(pool, enrollment) for enrollment in enrollments]
    attempts = [
        a
        for (a,) in rows(pool, "SELECT attempts FROM followup_enrollments WHERE project_id = %s", project.id)
    ]
    assert len(attempts) == 20 and set(attempts) <= {1, 2}, f"a lease expired twice: {sorted(attempts)}"
    calls = ledger(pool, project.id)
    assert proxy.received() == len(calls) <= sum(attempts), "a lease's step was called for twice"
    # the worker makes 4 calls at once; a call it gave up on (its timeout: the step fell back, ai_timeout)
    # may still wait at the one server, which answers one at a time, while the worker makes the next
    assert 2 <= proxy.max_in_flight <= 4 + outcomes.count("ai_timeout"), sorted(outcomes)
    print(f"real model: {attempts.count(2)} of 20 leased again")
    print(f"real model outcomes: {sorted(outcomes)}")


@pytest.mark.rabbitmq
@pytest.mark.timeout(240)
def test_an_ai_steps_worker_killed_mid_call_to_the_real_model_sends_one_message(
    db_url: str, amqp_url: str, pool: ConnectionPool, project: Project, proxy: ModelServer
) -> None:
    [enrollment] = enroll_many(pool, project, 1)
    # the lease outlasts a real call (a few seconds, more on a busy machine), else every draft would come
    # back fenced out, and is still short enough to wait for; a call slower still times out within it
    env = ai_env(
        db_url,
        amqp_url,
        proxy,
        FOLLOWUP_AI_LEASE_MS=str(LEASE_MS),
        AI_TIMEOUT_SECONDS=str(LEASE_MS / 1000 - 5),
        WORKER_THREADS="1",
    )
    proxy.gate.clear()  # the calls wait in front of the real model until the test lets them go
    workers = [start_worker("release", env)]
    victim = start_worker("ai_steps", env)
    try:
        # When the ai_steps worker is killed while its call is in flight
        wait_until(lambda: proxy.received() >= 1, timeout=60, what="the first call in flight")
        victim.send(signal.SIGKILL)
        assert victim.wait_exit() == -signal.SIGKILL
        workers.append(start_worker("ai_steps", env))

        # Then once the lease has run out the step is leased again with a new fence and called again
        def leased_again() -> bool:
            [(attempts,)] = rows(pool, "SELECT attempts FROM followup_enrollments WHERE id = %s", enrollment)
            return bool(attempts >= 2 and proxy.in_flight >= 1)

        wait_until(leased_again, timeout=60, what="the step leased again, its call in flight")
        proxy.gate.set()
        wait_until(lambda: messages_of(pool, enrollment), timeout=120, what="the step's message queued")
        wait_until(lambda: proxy.in_flight == 0, timeout=120, what="no call in flight")
        time.sleep(1.0)  # a late answer of an earlier fence has nothing left to queue
    finally:
        proxy.gate.set()
        codes = stop_all(workers)
    assert codes == [0] * len(workers), "\n".join(w.output for w in workers)

    assert proxy.received() >= 2
    assert_one_message_recorded(pool, enrollment)
    assert enrollment_state(pool, enrollment)["status"] == "completed"
    [(queued,)] = rows(pool, "SELECT count(*) FROM messages WHERE project_id = %s", project.id)
    assert queued == 1


def test_dev_with_the_local_model_says_so_and_stops_it_with_itself() -> None:
    """The start box names the model and its URL, the server answers there, and stops with dev."""
    folder = Path(tempfile.mkdtemp(prefix="followups-dev-test-"))  # not under tmp_path: see test_dev
    try:
        _dev_with_the_local_model(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _dev_with_the_local_model(data_dir: Path) -> None:
    dev = _start(data_dir, _free_port(), "--local-model")
    try:
        box = _box(dev)
        shown = re.fullmatch(
            rf"{local_model.MODEL_NAME} \(llama.cpp\) at (http://127.0.0.1:\d+/v1): AI_BASE_URL",
            box["AI model"],
        )
        assert shown, box
        url = shown.group(1)
        assert httpx.get(f"{url}/models", timeout=5).json()["data"][0]["id"] == local_model.MODEL_NAME
    finally:
        code = dev.stop(signal.SIGINT, timeout=60)
    assert code == 0, dev.output
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/models", timeout=5)
