"""What the rule-condition tests share: the catalogue attributes' kinds, the hypothesis strategies drawing
condition trees (with ordinary and with hostile values) and their settings."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from functools import cache, partial
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from libs.common.platform.conditions import CUSTOM_PREFIX

#: Each catalogue attribute's kind, as the module's documentation describes it.
KINDS = {
    "contact.name": "text",
    "contact.phone": "text",
    "contact.timezone": "text",
    "contact.consent": "text",
    "contact.opted_out": "bool",
    "contact.tags": "list",
    "conversation.status": "text",
    "conversation.priority": "text",
    "conversation.labels": "list",
    "conversation.assignee": "text",
    "conversation.team": "text",
    "conversation.inbox": "text",
    "conversation.number": "text",
    "message.type": "text",
    "message.content": "text",
    "lead.status": "text",
    "deal.stage": "text",
    "changed": "changed",
    "event.tags_added": "list",
    "event.tags_removed": "list",
    "event.labels_added": "list",
    "event.labels_removed": "list",
}

#: Fixed ids, so that trees drawn before the rows exist can name them (rolled back after each example).
NUMBER_IDS = (
    uuid.UUID("0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"),
    uuid.UUID("fedcba98-7654-4321-8fed-cba987654321"),
)


def json_kind(value: Any) -> str | None:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "text"
    return None


def number(value: int | float) -> Decimal:
    return Decimal(repr(value))


#: Strings that would break SQL, a format string or a naive case fold, if they were ever spliced in.
HOSTILE = (
    "",
    " ",
    "'",
    "''",
    '"',
    "' OR '1'='1",
    "'; DROP TABLE contacts; --",
    "--",
    "/*",
    ";",
    "\\",
    "\\'",
    "%s",
    "%(x)s",
    "%%",
    "%_",
    "{}",
    "{0}",
    "$1",
    "?",
    "É",
    "é",
    "ß",
    "SS",
    "straße",
    "İ",
    "\u0131",  # DOTLESS I: its Unicode upper case is an ASCII I
    "\u212a",  # KELVIN SIGN: Unicode lowers it to an ASCII k
    "ǅ",
    "🙂",
    "👍🏽",
    "日本",
    "a\tb\n",
)
VOCAB: dict[str, tuple[str, ...]] = {
    "contact.name": ("Alice", "alice smith", "Bob", "Émile", "STOP"),
    "contact.phone": ("+15550001", "+15550002", "+1555"),
    "contact.timezone": ("Europe/Paris", "America/New_York", "UTC"),
    "contact.consent": ("unknown", "granted", "revoked"),
    "contact.tags": ("vip", "lead", "Churn", "é"),
    "conversation.status": ("open", "pending", "snoozed", "resolved"),
    "conversation.priority": ("low", "medium", "high", "urgent"),
    "conversation.labels": ("urgent", "billing", "Bug"),
    "conversation.assignee": ("agent-1", "Agent-2", "ana"),
    "conversation.team": ("sales", "Support", "ventes"),
    "conversation.inbox": ("main", "Main/Sub", "vip"),
    "conversation.number": tuple(str(n) for n in NUMBER_IDS),
    "message.type": ("incoming", "outgoing"),
    "message.content": ("stop", "STOP please", "hello", "Ça va?"),
    "lead.status": ("open", "qualified", "won", "foreign"),
    "deal.stage": ("new", "proposal", "won", "foreign"),
    "event.tags_added": ("vip", "demo-booked", "Churn"),
    "event.tags_removed": ("vip", "trial"),
    "event.labels_added": ("urgent", "Bug"),
    "event.labels_removed": ("billing", "urgent"),
}
#: Custom attribute keys (a condition names ``contact.attributes.<key>``).
KEYS = (
    "score",
    "Score",
    "plan",
    "vip",
    "a.b",
    "it's",
    'say "hi"',
    "--",
    "%s",
    "%(x)s",
    "{}",
    "É",
    "🙂",
    "k" * 64,
)
CUSTOM_TEXT = ("gold", "Gold", "silver", "", "80", "true", "vip")
NUMBERS = (0, 1, -1, 1.5, 80, 80.0, 79.99, 100, 0.1, 1e-7, -0.0, 10**14, 999999999999999, -999999999999999.9)
#: What the payload's ``changed`` may name (attribute names, a custom one, near misses).
CHANGED_KEYS = (
    *(name for name in KINDS if name != "changed"),
    *(CUSTOM_PREFIX + key for key in ("score", "plan", "it's")),
    "Conversation.Status",
    "other",
    "'",
)
VOCAB["changed"] = CHANGED_KEYS
#: The ``from`` / ``to`` values of a change (1 and 1.0 are the same JSON value; [1] and 1 are not).
CHANGE_VALUES: tuple[Any, ...] = (
    "open",
    "OPEN",
    "pending",
    "",
    "vip",
    "É",
    "'",
    1,
    1.0,
    2,
    0,
    True,
    False,
    None,
    [],
    ["vip"],
    ["VIP"],
    [1, "vip"],
    [1.0, "vip"],
    [[]],
)

ODD_TEXT = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=6)
NUMBER = st.one_of(
    st.sampled_from(NUMBERS),
    st.integers(-1000, 1000),
    st.floats(-1e14, 1e14, allow_nan=False, allow_infinity=False),
)
ABSENT = object()
NOTHING: SearchStrategy[Any] = st.nothing()


#: Ways to write a text in another case (Python's mapping: non-ASCII letters change too).
CASES: tuple[Callable[[str], str], ...] = (str.upper, str.lower, str.swapcase, str.title)


def recased(texts: SearchStrategy[str]) -> SearchStrategy[str]:
    """One of ``texts`` as written or in another case."""
    return st.tuples(texts, st.sampled_from(CASES), st.booleans()).map(
        lambda drawn: drawn[1](drawn[0]) if drawn[2] else drawn[0]
    )


def _piece(drawn: tuple[str, int, int]) -> str:
    text, i, j = drawn
    start, end = sorted((i % (len(text) + 1), j % (len(text) + 1)))
    return text[start:end]


def pieces(texts: SearchStrategy[str]) -> SearchStrategy[str]:
    """A piece of one of ``texts`` (prefixes included)."""
    return st.tuples(texts, st.integers(0, 64), st.integers(0, 64)).map(_piece)


@cache
def words(pool: tuple[str, ...]) -> SearchStrategy[str]:
    return recased(st.sampled_from(pool))


@cache
def condition_text(attribute: str) -> SearchStrategy[str]:
    """A value a condition compares ``attribute`` with: mostly near what the contexts hold."""
    pool = CUSTOM_TEXT if attribute.startswith(CUSTOM_PREFIX) else VOCAB[attribute]
    return st.one_of(words(pool), pieces(st.sampled_from(pool)), words(HOSTILE), ODD_TEXT)


@dataclass(frozen=True)
class Pools:
    """Where a tree's values come from (each a function of the attribute the leaf is about)."""

    text: Callable[[str], SearchStrategy[str]]
    number: Callable[[str], SearchStrategy[int | float]]
    #: ``attribute_changed``'s value: {from, to}, one of them at least
    change: Callable[[str], SearchStrategy[dict[str, Any]]]
    key: SearchStrategy[str]
    #: More attributes to draw leaves about (those the context's changed names)
    attribute: SearchStrategy[str] = NOTHING


def ends_of(values: SearchStrategy[Any]) -> SearchStrategy[dict[str, Any]]:
    return st.one_of(
        st.fixed_dictionaries({"from": values}),
        st.fixed_dictionaries({"to": values}),
        st.fixed_dictionaries({"from": values, "to": values}),
    )


def make_leaf(attribute: str, operator: str, value: Any = ABSENT) -> dict[str, Any]:
    raw: dict[str, Any] = {"attribute": attribute, "operator": operator}
    if value is not ABSENT:
        raw["value"] = value
    return raw


def choices(attribute: str, pools: Pools) -> list[tuple[str, SearchStrategy[Any]]]:
    """Every operator that applies to ``attribute``, with a strategy for its value (a custom attribute's
    comparisons: one for each type of value)."""
    kind = "custom" if attribute.startswith(CUSTOM_PREFIX) else KINDS[attribute]
    presence = st.sampled_from([ABSENT, None])
    out: list[tuple[str, SearchStrategy[Any]]] = [("is_present", presence), ("is_not_present", presence)]
    if kind != "changed":
        out.append(("attribute_changed", pools.change(attribute)))
    if kind in ("bool", "custom"):
        out += [(operator, st.booleans()) for operator in ("equal_to", "not_equal_to")]
    if kind in ("text", "list", "custom", "changed"):
        text = pools.text(attribute)
        singles = ["contains", "does_not_contain"]
        if kind != "changed":
            singles += ["equal_to", "not_equal_to"] + ([] if kind == "list" else ["starts_with"])
            out += [(operator, st.lists(text, min_size=1, max_size=4)) for operator in ("in", "not_in")]
        out += [(operator, text) for operator in singles]
    if kind == "custom":
        numbers = pools.number(attribute)
        out += [(op, numbers) for op in ("equal_to", "not_equal_to", "is_greater_than", "is_less_than")]
        out += [(op, st.lists(numbers, min_size=1, max_size=4)) for op in ("in", "not_in")]
    return out


def leaf_of(attribute: str, pools: Pools) -> SearchStrategy[dict[str, Any]]:
    """A valid leaf about ``attribute``: any operator that applies to it, with a value of the right type."""
    return st.one_of(
        [
            values.map(partial(make_leaf, attribute, operator))
            for operator, values in choices(attribute, pools)
        ]
    )


def leaves(pools: Pools) -> SearchStrategy[dict[str, Any]]:
    """A leaf: about a catalogue attribute, a custom one, or one the context's changed names.

    (``.map(dict)`` keeps a one_of from being flattened into the one_of around it, which would weigh
    each of its branches like the other branches there.)"""
    about = cache(partial(leaf_of, pools=pools))
    return st.one_of(
        st.one_of([about(name) for name in KINDS]).map(dict),
        pools.key.flatmap(lambda key: about(CUSTOM_PREFIX + key)),
        pools.attribute.flatmap(about),
    )


def depth_of(raw: Any) -> int:
    if "all" in raw or "any" in raw:
        return 1 + max((depth_of(child) for children in raw.values() for child in children), default=0)
    return 0


def trees(leaf: SearchStrategy[dict[str, Any]], depth: int = 4) -> SearchStrategy[Any]:
    """Raw (JSON) trees: a leaf, or all / any groups nested up to ``depth`` deep."""
    return st.recursive(
        leaf,
        lambda children: st.tuples(st.sampled_from(["all", "any"]), st.lists(children, max_size=4)).map(
            lambda kind_children: {kind_children[0]: kind_children[1]}
        ),
        max_leaves=12,
    ).filter(lambda raw: depth_of(raw) <= depth)


QUICK = settings(
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)


def _leaf(attribute: Any, operator: Any, value: Any = ABSENT) -> dict[str, Any]:
    """A raw leaf (attribute and operator of any type, to write invalid ones too)."""
    return make_leaf(attribute, operator, value)


#: For a Hypothesis test that uses the database pool. psycopg_pool's worker threads call the global
#: ``random.random()`` whenever they open a connection (its expiry jitter). When one does that while
#: Hypothesis draws an example, Hypothesis sees the global random state change and warns that a strategy
#: used ``random``, which the suite's ``filterwarnings = error`` makes a failure. The strategies here use
#: no ``random``; only that warning is ignored, and only on these tests.
POOL_THREADS_USE_RANDOM = pytest.mark.filterwarnings(
    "ignore:Do not use the `random` module inside strategies:hypothesis.errors.HypothesisDeprecationWarning"
)
