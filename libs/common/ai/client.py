"""The model client: one OpenAI-compatible chat-completions request (OpenAI, vLLM, Ollama's ``/v1``, the
llama.cpp server), asking for structured output and validating the answer into ``{message, confidence,
reason}``. A server that refuses ``response_format`` is asked again without it (the prompt asks for the
same JSON). Every failure is a :class:`ModelAnswer` with its fallback reason, never an exception."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec

from libs.common.core.settings import AiSettings

log = logging.getLogger(__name__)

#: Longest message a WhatsApp text may carry; a longer answer is invalid output.
MAX_MESSAGE = 4096


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
    failure: str | None
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

    def close(self) -> None:
        self._http.close()

    def complete(self, messages: list[dict[str, str]]) -> ModelAnswer:
        body: dict[str, Any] = {
            "model": self.settings.model,
            "messages": messages,
            "temperature": 0.3,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "followup_message", "schema": ANSWER_SCHEMA, "strict": True},
            },
        }
        try:
            response = self._http.post("/chat/completions", json=body)
            if response.status_code == 400 and "response_format" in response.text:
                del body["response_format"]  # a server without structured output: the prompt asks for JSON
                response = self._http.post("/chat/completions", json=body)
        except httpx.TimeoutException:
            return ModelAnswer(None, "ai_timeout")
        except httpx.HTTPError as exc:
            log.warning("model call failed", extra={"error": repr(exc)})
            return ModelAnswer(None, "ai_error")
        if response.status_code != 200:
            log.warning("model call failed", extra={"status_code": response.status_code})
            return ModelAnswer(None, "ai_error")
        return _parse(response)


def _parse(response: httpx.Response) -> ModelAnswer:
    try:
        payload = response.json()
        usage = payload.get("usage") or {}
        tokens = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
        content = payload["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        return ModelAnswer(None, "ai_invalid_output")
    answer = _answer(content)
    if answer is None:
        return ModelAnswer(None, "ai_invalid_output", *tokens)
    return ModelAnswer(answer, None, *tokens)


def _answer(content: Any) -> Answer | None:
    """The answer in the content: a JSON object, possibly inside a fenced block; None when invalid."""
    if not isinstance(content, str):
        return None
    text = content.strip()
    if text.startswith("```"):
        text = text.strip("`").removeprefix("json").strip()
    try:
        answer = msgspec.convert(json.loads(text), Answer)
    except (ValueError, msgspec.ValidationError):
        return None
    message = answer.message.strip()
    if not message or len(message) > MAX_MESSAGE or "\x00" in message or not 0 <= answer.confidence <= 1:
        return None
    return Answer(message=message, confidence=answer.confidence, reason=answer.reason)
