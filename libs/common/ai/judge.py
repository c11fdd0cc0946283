"""Judging a model's answer before it may be sent: a draft that breaks a rule takes the step's fallback
(``ai_invalid_output``), never the send lane.

A small model constrained to the JSON schema still writes ``"confidence": 10``, an empty message, a
message about something else, ``Hi [Customer Name]``, a ``{{contact.name}}`` it was shown, or English for
a Portuguese step. :func:`judge` names the first rule an answer breaks:

    confidence_out_of_range   confidence outside 0..1
    empty                     no text once trimmed
    too_long                  longer than a WhatsApp text (4096 characters)
    control_characters        NUL or other control characters (newlines and tabs are fine)
    placeholder               an unrendered placeholder: ``{{...}}``, ``{name}``, ``[Customer Name]``
    not_a_message             text about the message instead of one (``Here is a follow-up message:``,
                              ``As an AI``, ``The customer read the quote``), or the prompt echoed back
    off_goal                  the step has a goal and the message shares no word with its goal and
                              instructions (a simple check: a 5-letter stem in common)
    wrong_language            the step has a language and the message is plainly in another: its script,
                              and for Latin-script languages its most common words (when they cannot tell,
                              the message passes)

These are honest, simple checks, not a second model: they catch what small models get wrong, and the
model's own ``confidence`` against the step's ``min_confidence`` stays the judge of quality.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Final

from libs.common.ai.client import Answer
from libs.common.contracts.limits import MAX_MESSAGE_LENGTH
from libs.common.followups.definition import AiStep

_PLACEHOLDER = re.compile(
    r"\{\{.*?\}\}|\{\s*[A-Za-z_][\w.]*\s*\}"
    r"|[\[<]\s*(?:(?:your|the|customer'?s?|contact'?s?|client'?s?|first|last|full|company|business|product)\s+)*"
    r"(?:name|company|business|date|time|product|link|url|number|phone|email|amount|price)\s*[\]>]",
    re.IGNORECASE,
)
_META = re.compile(
    r"\bas an ai\b|\blanguage model\b|^\s*sure[,!]? here\b|\bfollow-?up message\s*:"
    r"|^\s*(?:here is|here's) (?:a|an|the|my|your) (?:\w+ )?(?:follow|message|draft|response|reply|text)"
    r"|\"?confidence\"?\s*:|data \(json|\bthe (?:customer|contact|client)\b",
    re.IGNORECASE,
)
_WORD = re.compile(r"[^\W\d_]+")

#: Words that say how to write, not what about: they do not make a message on topic.
_HOW_WORDS = """about after again also always anything asking because been before being brief could does doing
    each even every from have having here into just keep kind like make many more most much must need
    never only other over please polite politely really short should some still such than that their
    them then there these they thing this those very want warm warmly were what when where whether which
    while will with would write your yours customer contact message follow followup friendly"""
_HOW = frozenset(_HOW_WORDS.split())

#: The commonest words of a few Latin-script languages (only to tell them apart).
_COMMON: Final[dict[str, frozenset[str]]] = {
    lang: frozenset(words.split())
    for lang, words in {
        "en": "the and you your is are to of for with have did any we our it this that would please",
        "es": "el los las que y usted tu su para con por es está hola gracias una nos muy",
        "pt": "os que você seu sua para com por é está olá obrigado uma não muito",
        "fr": "le les et vous votre pour avec est une des nous bonjour merci pas",
        "de": "der die das und sie ihr ihre für mit ist ein eine wir nicht hallo danke",
        "it": "il di che lei suo per con è una ciao grazie non siamo",
        "nl": "het en je jij uw voor met een wij niet hallo bedankt",
    }.items()
}

#: The script a language is written in, for languages not written in Latin letters.
_SCRIPT: Final[dict[str, str]] = {
    **dict.fromkeys(("ru", "uk", "bg", "sr", "mk", "be", "kk"), "CYRILLIC"),
    **dict.fromkeys(("ar", "fa", "ur"), "ARABIC"),
    **dict.fromkeys(("hi", "mr", "ne"), "DEVANAGARI"),
    "el": "GREEK",
    "he": "HEBREW",
    "th": "THAI",
    "ko": "HANGUL",
    "ja": "CJK",
    "zh": "CJK",
}
_CJK_NAMES = ("CJK", "HIRAGANA", "KATAKANA")


def judge(answer: Answer, step: AiStep) -> str | None:
    """The first rule ``answer`` breaks (its name, as listed above), or None when it may be sent."""
    message = answer.message
    if not 0 <= answer.confidence <= 1:
        return "confidence_out_of_range"
    if not message.strip():
        return "empty"
    if len(message) > MAX_MESSAGE_LENGTH:
        return "too_long"
    if any(unicodedata.category(char) == "Cc" and char not in "\n\t\r" for char in message):
        return "control_characters"
    if _PLACEHOLDER.search(message):
        return "placeholder"
    if _META.search(message) or _echoes(message, step.instructions):
        return "not_a_message"
    if step.goal and not _stems(message) & _stems(f"{step.goal} {step.instructions}"):
        return "off_goal"
    if step.language and not _in_language(message, step.language):
        return "wrong_language"
    return None


def _echoes(message: str, instructions: str) -> bool:
    """The instructions copied into the message (a model repeating its prompt)."""
    text = " ".join(instructions.split()).lower()
    return len(text) >= 20 and text in " ".join(message.split()).lower()


def _stems(text: str) -> set[str]:
    """The topic words of ``text``: four letters or more, not a word of how to write, cut to five letters."""
    return {
        word[:5] for word in (w.lower() for w in _WORD.findall(text)) if len(word) >= 4 and word not in _HOW
    }


def _script(char: str) -> str:
    name = unicodedata.name(char, "")
    if name.startswith(_CJK_NAMES):
        return "CJK"
    return name.split(" ", 1)[0]


def _in_language(message: str, language: str) -> bool:
    """False only when the message is plainly not in ``language``: most of its letters in another script,
    or, between the Latin-script languages known here, far more of another's common words than of its."""
    base = language.split("_", 1)[0]
    letters = [char for char in message if char.isalpha()]
    if not letters:
        return True
    expected = _SCRIPT.get(base, "LATIN")
    if expected == "HANGUL":
        share = sum(_script(c) in ("HANGUL", "CJK") for c in letters)
    else:
        share = sum(_script(c) == expected for c in letters)
    if share * 2 < len(letters):
        return False
    if base not in _COMMON:
        return True
    words = [word.lower() for word in _WORD.findall(message)]
    scores = {lang: sum(word in common for word in words) for lang, common in _COMMON.items()}
    own = scores.pop(base)
    other = max(scores.values())
    return not (other >= 2 and other > 2 * own)
