"""The judge of a model's answer (``libs/common/ai/judge.py``): what it refuses and, as much, what it lets
through (a judge that refused good drafts would send every step's fallback). The refusals through a whole
step, with the fallback sent and counted, are in ``tests/test_ai_steps.py``."""

from __future__ import annotations

from typing import Any

import pytest

from libs.common.ai.client import Answer
from libs.common.ai.judge import judge
from libs.common.followups.definition import AiStep, SkipFallback

INSTRUCTIONS = "Ask whether they had a chance to read the quote. Be brief and warm."


def step(**fields: Any) -> AiStep:
    defaults: dict[str, Any] = {"instructions": INSTRUCTIONS, "fallback": SkipFallback()}
    return AiStep(**(defaults | fields))


@pytest.mark.parametrize(
    ("message", "fields"),
    [
        ("Hi Ana, did you get a chance to read the quote?", {}),
        ("Hi Ana, did you get a chance to read the quote?", {"goal": "Get an answer on the quote"}),
        ("Here is the link to your quote: https://example.com/q/17", {}),
        ("y" * 4096, {}),
        ("Line one\nline two\tand a tab", {}),
        ("Hi Ana :-) any thoughts on the quote [PDF, 2 pages]?", {}),  # brackets, but no placeholder
        ("Olá Ana, você já leu a cotação que enviamos?", {"language": "pt_BR"}),
        ("Hola Ana, ¿pudiste leer la cotización que te enviamos?", {"language": "es"}),
        ("Ana?", {"language": "de"}),  # too short to tell: passes
        ("Анна, вы успели прочитать наше предложение?", {"language": "ru"}),
        ("アナさん、見積もりはご覧いただけましたか?", {"language": "ja"}),
        ("Hi Ana, did you read the quote?", {"language": "sw"}),  # a language without a word list
    ],
)
def test_a_good_draft_passes(message: str, fields: dict[str, Any]) -> None:
    assert judge(Answer(message=message, confidence=0.8), step(**fields)) is None


@pytest.mark.parametrize(
    ("message", "confidence", "fields", "problem"),
    [
        ("Hi", 1.01, {}, "confidence_out_of_range"),
        ("Hi", float("nan"), {}, "confidence_out_of_range"),
        ("", 0.9, {}, "empty"),
        ("y" * 4097, 0.9, {}, "too_long"),
        ("Hi\x07 Ana", 0.9, {}, "control_characters"),
        ("Hi {{contact.name}}, any news?", 0.9, {}, "placeholder"),
        ("Hi {first_name}, any news?", 0.9, {}, "placeholder"),
        ("Hi <your name>, any news?", 0.9, {}, "placeholder"),
        ("Dear [First Name], regards, [Company]", 0.9, {}, "placeholder"),
        ("As an AI, I cannot know whether Ana read it.", 0.9, {}, "not_a_message"),
        ('Sure, here you go: {"message": "Hi", "confidence": 0.9}', 0.9, {}, "not_a_message"),
        (f"Hi Ana! {INSTRUCTIONS}", 0.9, {}, "not_a_message"),
        # what SmolLM2-135M wrote: about the customer, not to her
        ("The customer read the quote we sent. She said it was worth it.", 0.9, {}, "not_a_message"),
        ("Hello! Have a lovely weekend.", 0.9, {"goal": "Close the quote"}, "off_goal"),
        (
            "Hi Ana, did you get a chance to read the quote we sent?",
            0.9,
            {"language": "pt"},
            "wrong_language",
        ),
        ("Hi Ana, did you read the quote?", 0.9, {"language": "ru"}, "wrong_language"),
    ],
)
def test_a_bad_answer_is_refused_naming_the_rule(
    message: str, confidence: float, fields: dict[str, Any], problem: str
) -> None:
    assert judge(Answer(message=message, confidence=confidence), step(**fields)) == problem
