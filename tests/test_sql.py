"""Named SQL: the loader's rules, and every named query of the project against the migrated schema."""

from __future__ import annotations

import re
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import psycopg
import pytest

from libs.common.core.sql import OverIds, numbered, of_one, parse_queries, with_parts
from libs.common.followups import release_state, transitions
from libs.common.platform import messages, send_lane
from libs.common.rules import triggers

ROOT = Path(__file__).resolve().parent.parent


def _sql_files() -> Iterator[tuple[str, str]]:
    """Every named-SQL file of the project, as (package, file name); migrations are not named SQL."""
    for path in sorted([*ROOT.glob("libs/**/*.sql"), *ROOT.glob("services/**/*.sql")]):
        if "migrations" in path.parts:
            continue
        package = ".".join(path.relative_to(ROOT).parent.parts)
        yield package, path.name


#: Named pieces of statements (the send lane's two claims share their second half): each is prepared within
#: the statements made of it (:data:`COMPOSED`).
FRAGMENTS = {
    f"libs.common.platform/send_lane.sql:{name}"
    for name in ("pick_queued_messages", "pick_queued_for_numbers", "claim_picked")
}
COMPOSED = {
    "send_lane.CLAIM_QUEUED_MESSAGES": send_lane.CLAIM_QUEUED_MESSAGES,
    "send_lane.CLAIM_QUEUED_FOR_NUMBERS": send_lane.CLAIM_QUEUED_FOR_NUMBERS,
    "transitions.ADVANCE_STEP": transitions.ADVANCE_STEP,
    "transitions.FINISH": transitions.FINISH.many,
    "transitions.FINISH (one)": transitions.FINISH.one,
    "messages.CANCEL_QUEUED (one)": messages.CANCEL_QUEUED.one,
    "transitions.FINISH_STEP": transitions.FINISH_STEP,
    "transitions.ADVANCE_STEP_QUEUED": transitions.ADVANCE_STEP_QUEUED,
    "transitions.FINISH_STEP_QUEUED": transitions.FINISH_STEP_QUEUED,
    "triggers.MARK_ONE_PROCESSED": triggers.MARK_ONE_PROCESSED,
}
#: Statements numbered once for a raw cursor (core.sql.numbered): psycopg does not convert them, so their
#: length is free.
NUMBERED = {"release_state.CLAIM_WITH_STATE": release_state.CLAIM_WITH_STATE.text}


def _named_queries() -> Iterator[tuple[str, str, str]]:
    for package, filename in _sql_files():
        text = resources.files(package).joinpath(filename).read_text(encoding="utf-8")
        for name, statement in parse_queries(text).items():
            yield f"{package}/{filename}:{name}", name, statement


def test_a_query_needs_its_one_line_description() -> None:
    with pytest.raises(ValueError, match="'bare' has no one-line description"):
        parse_queries("-- name: bare\nSELECT 1\n")
    with pytest.raises(ValueError, match="'blank' has no one-line description"):
        parse_queries("-- name: blank\n--   \nSELECT 1\n")


def test_a_query_needs_a_statement_and_a_name_of_its_own() -> None:
    with pytest.raises(ValueError, match="'empty' has no statement"):
        parse_queries("-- name: empty\n-- Says what it does, does nothing.\n")
    with pytest.raises(ValueError, match="'twice' is defined twice"):
        parse_queries("-- name: twice\n-- One.\nSELECT 1\n\n-- name: twice\n-- Two.\nSELECT 2\n")


def test_the_loader_keeps_the_statement_and_drops_the_comments() -> None:
    queries = parse_queries(
        "-- A file-level note.\n\n-- name: one\n-- The number one.\nSELECT 1\n-- trailing note\nFROM x\n"
    )
    assert queries == {"one": "SELECT 1\nFROM x"}


def test_numbering_gives_each_name_one_number_and_unescapes_percent() -> None:
    statement = numbered("SELECT %(a)s, %(b)s, %(a)s, 'x%%' FROM t WHERE id = %(c)s")
    assert statement.text == "SELECT $1, $2, $1, 'x%' FROM t WHERE id = $3"
    assert statement.values({"c": 3, "b": 2, "a": 1, "unused": 0}) == (1, 2, 3)


def test_a_statement_over_ids_is_written_for_one_id() -> None:
    statement = "UPDATE t SET x = 1 WHERE project_id = %(project_id)s AND id = ANY(%(ids)s)"
    assert of_one(statement) == "UPDATE t SET x = 1 WHERE project_id = %(project_id)s AND id = %(id)s"
    typed = "DELETE FROM t WHERE id = ANY(%(ids)s::bigint[]) AND project_id = %(project_id)s"
    assert (
        of_one(typed, "trigger_id")
        == "DELETE FROM t WHERE id = %(trigger_id)s AND project_id = %(project_id)s"
    )
    over_ids = OverIds.of(statement)
    assert over_ids.bound({"project_id": 1}, [7]) == (over_ids.one, {"project_id": 1, "id": 7})
    assert over_ids.bound({"project_id": 1}, (7, 8)) == (statement, {"project_id": 1, "ids": [7, 8]})
    with pytest.raises(ValueError, match="0 found"):
        of_one("SELECT * FROM t WHERE id = %(id)s")  # nothing over ids: a mistake, not a no-op


def test_a_part_with_common_table_expressions_of_its_own_brings_them_up_beside_it() -> None:
    part = (
        "WITH a AS (\nINSERT INTO t VALUES (')(', 1) RETURNING id\n), b AS (SELECT (1))\nUPDATE u SET x = 1"
    )
    assert with_parts("WITH c AS (SELECT 1)\nDELETE FROM v", p=part) == (
        "WITH a AS (\nINSERT INTO t VALUES (')(', 1) RETURNING id\n),\nb AS (SELECT (1)),\n"
        "p AS (\nUPDATE u SET x = 1\n),\nc AS (SELECT 1)\nDELETE FROM v"
    )
    with pytest.raises(AssertionError, match="a name used twice"):
        with_parts("WITH a AS (SELECT 1)\nDELETE FROM v", p=part)


def test_the_loader_drops_the_indentation() -> None:
    queries = parse_queries("-- name: one\n-- The number one.\nSELECT 1\n    FROM x  \n\n   WHERE y\n")
    assert queries == {"one": "SELECT 1\nFROM x\nWHERE y"}


def test_every_statement_fits_psycopgs_cache_of_converted_queries() -> None:
    """psycopg keeps a statement's conversion (its placeholders found, its parts split) only up to 4,096
    characters: a longer one is parsed again at every execution (release_state was, at every step)."""
    from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH

    statements = [(where, s) for where, _, s in _named_queries() if where not in FRAGMENTS]
    too_long = [
        f"{where}: {len(s.encode())}"
        for where, s in [*statements, *COMPOSED.items()]
        if len(s.encode()) > MAX_CACHED_STATEMENT_LENGTH
    ]
    assert statements and not too_long, too_long


def test_there_are_named_queries_to_check() -> None:
    # the prepare test below must not pass by finding nothing
    names = [where for where, _, _ in _named_queries()]
    assert len(names) > 40
    assert any(where.endswith("release_state.sql:release_state") for where in names)
    assert any(where.endswith("claim.sql:claim_due_enrollment") for where in names)


_PARAM = re.compile(r"%\((\w+)\)[sb]")


def _positional(statement: str) -> str:
    """``%(name)s`` (and binary ``%(name)b``) placeholders as ``$n`` (one number per name), as the server sees
    them."""
    numbers: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        return f"${numbers.setdefault(match.group(1), len(numbers) + 1)}"

    return _PARAM.sub(number, statement)


def test_every_named_query_prepares_against_the_migrated_schema(db_url: str) -> None:
    """PREPARE parses and plans each statement against the real schema: a renamed column or table, a
    missing index expression or a type error fails here even on a path no scenario runs."""
    failures = []
    statements = [(where, statement) for where, _, statement in _named_queries() if where not in FRAGMENTS]
    statements += [*COMPOSED.items(), *NUMBERED.items()]
    with psycopg.connect(db_url, autocommit=True) as conn:
        for i, (where, statement) in enumerate(statements):
            try:
                conn.execute(f"PREPARE q{i} AS {_positional(statement)}".encode())
                conn.execute(f"DEALLOCATE q{i}".encode())
            except psycopg.Error as exc:
                failures.append(f"{where}: {exc}")
    assert not failures, "\n".join(failures)
