"""Rule conditions compile to SQL with every user value bound as a parameter: no value and no custom
attribute key, however hostile, ever reaches the SQL text."""

from __future__ import annotations

import uuid
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg import sql
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from libs.common.platform.conditions import (
    CUSTOM_PREFIX,
    compile_conditions,
    parse_conditions,
)
from libs.common.rules.matching import CONTEXT, inline, match
from tests.condition_helpers import (
    HOSTILE,
    NUMBER,
    ODD_TEXT,
    POOL_THREADS_USE_RANDOM,
    QUICK,
    Pools,
    ends_of,
    json_kind,
    leaves,
    trees,
)

#: In the hostile trees every string is hostile; those with MARK in them cannot occur in any SQL text.
MARK = "¤"
MARKED = st.tuples(st.sampled_from(HOSTILE), st.sampled_from(HOSTILE)).map(lambda ab: f"{ab[0]}{MARK}{ab[1]}")
HOSTILE_TEXT = st.one_of(MARKED, st.sampled_from(HOSTILE), ODD_TEXT.map(lambda text: MARK + text))

HOSTILE_POOLS = Pools(
    text=lambda attribute: HOSTILE_TEXT,
    number=lambda attribute: NUMBER,
    change=lambda attribute: ends_of(
        st.one_of(HOSTILE_TEXT, st.lists(HOSTILE_TEXT, max_size=3), NUMBER, st.booleans(), st.none())
    ),
    key=st.one_of(MARKED, st.sampled_from([text for text in HOSTILE if text])),
)


# --- no value reaches the SQL text -------------------------------------------------------------------------


def blunt(raw: Any) -> Any:
    """The same tree with every string a plain "x" (custom keys "k"), numbers 0: the same types."""

    def value(item: Any) -> Any:
        if isinstance(item, str):
            return "x"
        if isinstance(item, list):
            return [value(i) for i in item]
        if isinstance(item, dict):
            return {key: value(i) for key, i in item.items()}
        return 0 if json_kind(item) == "number" else item

    if "all" in raw or "any" in raw:
        return {kind: [blunt(child) for child in children] for kind, children in raw.items()}
    out = dict(raw)
    if raw["attribute"].startswith(CUSTOM_PREFIX):
        out["attribute"] = CUSTOM_PREFIX + "k"
    if "value" in raw:
        out["value"] = value(raw["value"])
    return out


def strings_in(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list | tuple):
        return [text for item in value for text in strings_in(item)]
    if isinstance(value, dict):
        return [text for item in value.values() for text in strings_in(item)]
    if isinstance(value, Jsonb):
        return strings_in(value.obj)
    return []


def user_strings(raw: Any) -> list[str]:
    """Every string a user gave in a raw tree: values and custom keys."""
    if "all" in raw or "any" in raw:
        return [text for children in raw.values() for child in children for text in user_strings(child)]
    found = strings_in(raw.get("value"))
    if raw["attribute"].startswith(CUSTOM_PREFIX):
        found.append(raw["attribute"].removeprefix(CUSTOM_PREFIX))
    return found


@POOL_THREADS_USE_RANDOM
@settings(QUICK, max_examples=150)
@given(raw=trees(leaves(HOSTILE_POOLS)))
def test_values_and_keys_are_bound_never_written_into_the_sql(pool: ConnectionPool, raw: Any) -> None:
    predicate, params = compile_conditions(parse_conditions(raw))
    skeleton, _ = compile_conditions(parse_conditions(blunt(raw)))
    bound = strings_in(params)
    with pool.connection() as conn:
        text = predicate.as_string(conn)
        # the SQL text does not depend on the values at all, and has one placeholder per parameter
        assert text == skeleton.as_string(conn)
        assert text.count("%s") == len(params)
        assert "%(" not in text
        assert MARK not in text
        for given_text in user_strings(raw):
            if MARK in given_text:
                assert given_text not in text
            # bound as given (a custom key within the attribute name attribute_changed binds)
            assert any(given_text in param for param in bound), given_text
        # and the server takes it as it is
        query = sql.SQL("SELECT {} FROM {} WHERE t.id = -1").format(predicate, CONTEXT)
        assert conn.execute(query, params).fetchall() == []
        # written in as psycopg-quoted literals (how the triggers service matches), the server parses it too
        # (test_rule_condition_sql checks that it answers as the bound predicate does)
        assert match(conn, uuid.uuid4(), [-1], [inline(conn, predicate, params)]) == {}
