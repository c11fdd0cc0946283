"""The model client: one OpenAI-compatible chat-completions request (OpenAI, vLLM, Ollama's ``/v1``, the
llama.cpp server), asking for structured output and validating the answer into ``{message, confidence,
reason}``: the schema goes as OpenAI's ``json_schema`` or as the llama.cpp server's ``json_object`` with a
``schema`` (``AI_RESPONSE_FORMAT``). A server that refuses it is asked with the other form, then without
one (the prompt asks for the same JSON). Every failure is a :class:`ModelAnswer` with its fallback reason,
never an exception. The client checks the answer's shape only; whether it may be sent is
:func:`libs.common.ai.judge.judge`'s call."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec

from libs.common.core.settings import AiSettings
from libs.common.followups.release_step import AiFallbackReason

log = logging.getLogger(__name__)


class Answer(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    message: str
    confidence: float
    reason: str = ""


ANSWER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "message": {
            "type": "string",
            "description": "the WhatsApp message to send, in the contact's language",
        },
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        "reason": {"type": "string", "description": "why this message, in one sentence"},
    },
    "required": ["message", "confidence", "reason"],
    "additionalProperties": False,
}


@dataclass(frozen=True)
class ModelAnswer:
    """The answer, or the reason it cannot be used (``ai_timeout``, ``ai_error``, ``ai_invalid_output``)."""

    answer: Answer | None
    failure: AiFallbackReason | None
    prompt_tokens: int = 0
    completion_tokens: int = 0


class ModelClient:
    """One process's client (thread-safe: the ai_steps service calls it from many threads at once)."""

    def __init__(self, settings: AiSettings) -> None:
        assert settings.base_url is not None
        self.settings = settings
        headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
        self._http = httpx.Client(
            base_url=settings.base_url.rstrip("/"),
            headers=headers,
            timeout=httpx.Timeout(settings.timeout_seconds, connect=min(5.0, settings.timeout_seconds)),
            limits=httpx.Limits(
                max_connections=settings.concurrency, max_keepalive_connections=settings.concurrency
            ),
        )
        #: The forms of ``response_format`` to try, AI_RESPONSE_FORMAT's first, and none at the end; the
        #: index of the first one to try (the one the server last took).
        preferred = settings.response_format
        self._formats: list[dict[str, Any] | None] = [
            response_format(kind) for kind in (preferred, *(RESPONSE_FORMATS - {preferred}))
        ] + [None]
        self._accepted = 0

    def close(self) -> None:
        self._http.close()

    def cost_micros(self, called: ModelAnswer) -> int:
        """The call's cost in millionths of the price's currency (a price per million tokens is a price in
        millionths per token)."""
        return round(
            called.prompt_tokens * self.settings.prompt_price_per_million
            + called.completion_tokens * self.settings.completion_price_per_million
        )

    def complete(self, messages: list[dict[str, str]]) -> ModelAnswer:
        """One answer within ``AI_TIMEOUT_SECONDS`` in all. A server refusing the ``response_format`` (an
        error naming it: OpenAI-compatible servers answer 400, the llama.cpp server 500 to ``json_schema``)
        is asked again in the time left with the other form, then without one (the prompt asks for the same
        JSON); the form it took is where this client starts from then on."""
        body: dict[str, Any] = {"model": self.settings.model, "messages": messages, "temperature": 0.3}
        deadline = time.monotonic() + self.settings.timeout_seconds
        start = self._accepted
        try:
            for index in range(start, len(self._formats)):
                form = self._formats[index]
                if form is None:
                    body.pop("response_format", None)
                else:
                    body["response_format"] = form
                status, content = self._post(body, deadline)
                if not (form is not None and status >= 400 and b"response_format" in content):
                    break
                log.info("the model server refused response_format", extra={"type": form["type"]})
        except (httpx.TimeoutException, _DeadlinePassed):
            return ModelAnswer(None, "ai_timeout")
        except httpx.HTTPError as exc:
            log.warning("model call failed", extra={"error": repr(exc)})
            return ModelAnswer(None, "ai_error")
        if status != 200:
            log.warning("model call failed", extra={"status_code": status})
            return ModelAnswer(None, "ai_error")
        if index > start:
            self._accepted = index  # one attribute, set to what a server took: safe across threads
        return _parse(content)

    def _post(self, body: dict[str, Any], deadline: float) -> tuple[int, bytes]:
        """POST, reading the answer until ``deadline`` at the latest (each read waits for the time left)."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise _DeadlinePassed
        with self._http.stream("POST", "/chat/completions", json=body, timeout=left) as response:
            chunks = []
            for chunk in response.iter_bytes():
                chunks.append(chunk)
                if time.monotonic() > deadline:
                    raise _DeadlinePassed
            return response.status_code, b"".join(chunks)


#: The two forms of asking for the schema (AI_RESPONSE_FORMAT).
RESPONSE_FORMATS = frozenset({"json_schema", "json_object"})


def response_format(kind: str) -> dict[str, Any]:
    """The ``response_format`` asking for :data:`ANSWER_SCHEMA`: OpenAI's ``json_schema``, or the llama.cpp
    server's ``json_object`` with the schema beside it."""
    if kind == "json_object":
        return {"type": "json_object", "schema": ANSWER_SCHEMA}
    return {
        "type": "json_schema",
        "json_schema": {"name": "followup_message", "schema": ANSWER_SCHEMA, "strict": True},
    }


class _DeadlinePassed(Exception):
    """The call's time ran out."""


def _tokens(value: Any) -> int:
    """A usage figure as the ledger can hold it (a server's nonsense clamped, not trusted)."""
    try:
        return max(0, min(int(value or 0), 2**31 - 1))
    except (TypeError, ValueError, OverflowError):
        return 0


def _parse(body: bytes) -> ModelAnswer:
    try:
        payload = json.loads(body)
        usage = payload.get("usage") or {}
        tokens = _tokens(usage.get("prompt_tokens")), _tokens(usage.get("completion_tokens"))
        content = payload["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return ModelAnswer(None, "ai_invalid_output")
    answer = _answer(content)
    if answer is None:
        return ModelAnswer(None, "ai_invalid_output", *tokens)
    return ModelAnswer(answer, None, *tokens)


def _answer(content: Any) -> Answer | None:
    """The answer in the content: a JSON object of the schema's shape, possibly inside a fenced block; None
    when it is not one."""
    if not isinstance(content, str):
        return None
    text = content.strip()
    if text.startswith("```"):
        text = text.strip("`").removeprefix("json").strip()
    try:
        answer = msgspec.convert(json.loads(text), Answer)
    except (ValueError, msgspec.ValidationError):
        return None
    return Answer(message=answer.message.strip(), confidence=answer.confidence, reason=answer.reason)
