"""Each table has one owning context, and this test proves it.

Every context's ``__init__`` lists the tables it owns (``OWNS``); every table the migrations create has
exactly one owner. Every statement under ``libs/`` and ``services/`` (the named queries of each ``.sql``
file, read through the project's loader, and every SQL text in a ``.py`` file: string literals and
``psycopg.sql.SQL(...)`` texts) is parsed for the tables it writes (``INSERT``, ``UPDATE``, ``DELETE``,
``COPY``, ``TRUNCATE``, CTEs included) and reads (``FROM``, ``JOIN``, ``USING``):

- a context writes only the tables it owns;
- a context reads another context's table only where :data:`ALLOWED_READS` says so, with the reason;
- a service (``services/*``) is not a context: any domain table in its SQL is a violation.

Migrations (``core/migrations/*.sql``) are schema, not queries: they are read only for the table names.
The parser needs no database: it runs in ``make check``.
"""

from __future__ import annotations

import ast
import functools
import importlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from libs.common.core.sql import parse_queries

ROOT = Path(__file__).resolve().parent.parent
#: Where the statements are looked for.
SOURCES = ("libs", "services")
#: Where the schema is (read for its tables, not checked as queries).
MIGRATIONS = ROOT / "libs" / "common" / "core" / "migrations"
#: The bounded contexts of ``libs/common`` (each ``__init__`` has an ``OWNS`` list).
CONTEXTS = ("contracts", "core", "platform", "followups", "rules", "ai", "retention", "ingress", "channels")


def _reads(context: str, where: str, tables: tuple[str, ...], reason: str) -> dict[tuple[str, str, str], str]:
    return {(context, table, where): reason for table in tables}


#: The one hot-path statement of a step and the joins that make a list or a claim one statement.
_ONE_STATEMENT = "one statement instead of a call per owner (each call a round trip)"

#: Reads of another context's tables, each with its reason: (reading context, table, "file::query", or the
#: file alone for a ``.py`` statement or a file whose queries all share the reason) -> why a function of the
#: owner would not do. Writes are never allowed here.
ALLOWED_READS: dict[tuple[str, str, str], str] = {
    **_reads(
        "followups",
        "libs/common/followups/release_state.sql::release_state",
        (
            "contacts",
            "projects",
            "messages",
            "numbers",
            "conversations",
            "message_counters",
            "usage_counters",
        ),
        "the release step's one statement share-locks the contact and reads everything its checks and "
        "sending constraints need (the project's plan, the number to send from, the caps' counts): a call "
        "per owner would add round trips to the hot path",
    ),
    **_reads(
        "followups",
        "libs/common/followups/enrollments.sql::enrollment_contact",
        ("contacts", "conversations", "numbers", "projects"),
        "enroll() checks the contact, its number and conversation and the plan limit in one round trip",
    ),
    **_reads(
        "followups",
        "libs/common/followups/enrollments.sql::lock_project",
        ("projects",),
        "the plan limit: a project with one takes a lock serialising its enrollments, before its live "
        "count is read",
    ),
    **_reads(
        "followups",
        "libs/common/followups/enrollments.sql::enrollment_messages",
        ("messages",),
        "the messages an enrollment queued, by the enrollment's id the message carries (no platform query "
        "knows enrollments)",
    ),
    **_reads(
        "followups",
        "libs/common/followups/project_settings.sql::get_settings",
        ("projects",),
        "the settings carry the project's time zone (the platform's, set through platform.projects): one "
        "statement for the rule, AI and message paths that read the settings",
    ),
    **_reads(
        "followups",
        "libs/common/followups/statistics.sql::replies_after_step",
        ("messages", "message_status_events"),
        "a sequence's reply statistics join its step runs with their messages' send reports and the "
        "replies: an aggregate over the three tables",
    ),
    **_reads(
        "followups",
        "libs/common/followups/statistics.sql::template_messages_by_month",
        ("messages",),
        "a sequence's monthly spend counts its step runs' template messages the provider took, by month and "
        "category: an aggregate over both tables",
    ),
    **_reads(
        "followups",
        "libs/common/followups/statistics.sql::step_outcomes",
        ("messages",),
        "a sequence's statistics count its step runs' messages by latest status: an aggregate over both "
        "tables (a message's status per step run would be a round trip each)",
    ),
    **_reads(
        "followups",
        "libs/common/followups/provider_feedback.sql::failed_step",
        ("messages", "contacts", "projects"),
        "a follow-up refused outside the service window is retried as its template: the step run of the "
        "failed message, locked, with what its parameters are rendered from (the contact, the project's "
        "zone) in one statement, as the release step reads them",
    ),
    **_reads(
        "followups",
        "libs/common/followups/stops.sql::queued_followups",
        ("messages",),
        "the stop path picks the queued follow-up messages of the enrollments it stops (by their enrollment "
        "and its stop flag) in one statement; the platform cancels them",
    ),
    **_reads(
        "rules",
        "libs/common/rules/actions.sql::message_recipient",
        ("contacts", "projects"),
        f"what a rule's message needs of its contact and project: {_ONE_STATEMENT}",
    ),
    **_reads(
        "rules",
        "libs/common/rules/bulk.sql",
        ("contacts",),
        "a bulk job resolves its segment's contacts (phones, anchors) in batches of thousands: one statement "
        "a batch",
    ),
    **_reads(
        "rules",
        "libs/common/rules/executions.sql",
        ("conversations", "projects"),
        "a delayed rule's guard chain compares the conversation's anchors now with the trigger's, under the "
        f"execution's lock, and reads the project's time zone for business hours: {_ONE_STATEMENT}",
    ),
    **_reads(
        "rules",
        "libs/common/rules/triggers.sql",
        ("conversations",),
        "a trigger records the conversation's anchors of this moment in the event's own transaction, in its "
        "insert",
    ),
    **_reads(
        "rules",
        "libs/common/rules/webhooks.sql",
        ("projects",),
        "a webhook delivery is signed with its project's secret, read with the claim",
    ),
    **_reads(
        "followups",
        "libs/common/followups/transitions.sql::end_by_criterion",
        ("messages",),
        "a conversion is attributed to the last step whose message was sent, read by the enrollment's id the "
        "message carries, in the statement that converts it",
    ),
    **_reads(
        "followups",
        "libs/common/followups/transitions.sql::convert_late",
        ("messages",),
        "a late conversion is attributed to the last step whose message was sent, as end_by_criterion",
    ),
}


@dataclass(frozen=True)
class Statement:
    """One SQL text found in the sources: where it is, its name, and who runs it."""

    #: The file, relative to the repository root.
    path: str
    #: The query's name (a ``.sql`` file) or ``line N`` (a ``.py`` file).
    name: str
    #: The context (``libs/common/<context>/``), or None for a service.
    context: str | None
    text: str

    @property
    def where(self) -> str:
        return f"{self.path}::{self.name}" if self.path.endswith(".sql") else self.path


@dataclass(frozen=True)
class Tables:
    """What a statement writes and what it reads (known tables only; CTE names are not tables)."""

    written: frozenset[str]
    read: frozenset[str]


#: A word (a name, maybe schema-qualified) or one other character.
_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*(?:\.[A-Za-z_][A-Za-z0-9_$]*)?|\S")
#: A line comment and a string literal: neither names a table.
_COMMENT = re.compile(r"--[^\n]*")
_STRING = re.compile(r"'(?:[^']|'')*'")
#: A ``.py`` string is SQL when it holds a keyword written as SQL is (upper case) with a clause after it.
_PY_SQL = re.compile(
    r"\b(SELECT|CREATE TABLE|INSERT INTO|UPDATE|DELETE FROM|COPY|TRUNCATE|WITH)\b[\s\S]*\b[A-Za-z_]"
)
#: The words before ``UPDATE`` that make it a lock or an upsert, not a write of the next name.
_NOT_WRITE = {"DO", "FOR", "KEY"}


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(_STRING.sub("''", _COMMENT.sub(" ", text)))


def _name(token: str) -> str:
    return token.rsplit(".", 1)[-1].lower()


def parse_tables(text: str, known: frozenset[str]) -> Tables:
    """The known tables ``text`` writes and reads."""
    tokens = _tokens(text)
    upper = [t.upper() for t in tokens]
    ctes = {
        tokens[i].lower()
        for i in range(1, len(tokens) - 2)
        if upper[i - 1] in ("WITH", "RECURSIVE", ",")
        and upper[i + 1] == "AS"
        and "(" in upper[i + 2 : i + 5]
        and tokens[i][0].isalpha()
    }
    written: set[str] = set()
    read: set[str] = set()

    def target(i: int, skip: tuple[str, ...] = ("ONLY", "TABLE"), *, read: bool = False) -> int | None:
        """The index of the table name at ``i`` (after ``skip`` words); a read is no call ``f(...)``."""
        while i < len(tokens) and upper[i] in skip:
            i += 1
        call = read and i + 1 < len(tokens) and tokens[i + 1] == "("
        return i if i < len(tokens) and tokens[i][0].isalpha() and not call else None

    for i, word in enumerate(upper):
        at: int | None = None
        before, following = upper[i - 1] if i else "", upper[i + 1] if i + 1 < len(upper) else ""
        if (word, following) in (("INSERT", "INTO"), ("DELETE", "FROM")):
            at = target(i + 2)
        elif word in ("COPY", "TRUNCATE") or (word == "UPDATE" and before not in _NOT_WRITE):
            at = target(i + 1)
        if at is not None:
            if _name(tokens[at]) in known and _name(tokens[at]) not in ctes:
                written.add(_name(tokens[at]))
            continue
        if word in ("FROM", "JOIN", "USING") and (before, word) != ("DELETE", "FROM"):
            j = target(i + 1, ("ONLY", "LATERAL"), read=True)
            while j is not None:
                name = _name(tokens[j])
                if name in known and name not in ctes:
                    read.add(name)
                # ``FROM a x, b y``: the next table of a comma list
                k = j + 1
                if k < len(tokens) and upper[k] == "AS":
                    k += 1
                if k < len(tokens) and tokens[k][0].isalpha() and upper[k] not in _CLAUSES:
                    k += 1
                j = (
                    target(k + 1, ("ONLY", "LATERAL"), read=True)
                    if k < len(tokens) and tokens[k] == ","
                    else None
                )
    return Tables(frozenset(written), frozenset(read - written))


#: Words that end a FROM item (so are no alias).
_CLAUSES = {
    "WHERE", "JOIN", "LEFT", "RIGHT", "INNER", "FULL", "CROSS", "ON", "USING", "GROUP", "ORDER", "LIMIT",
    "FOR", "RETURNING", "SET", "UNION", "HAVING", "WINDOW", "OFFSET", "TABLESAMPLE", "NATURAL", "EXCEPT",
    "INTERSECT", "FETCH", "VALUES", "SELECT", "AND", "OR", "TO", "WITH",
}  # fmt: skip


@functools.cache
def schema_tables() -> frozenset[str]:
    """Every table the migrations leave (and the ones the code creates itself: ``schema_migrations``)."""
    tables: set[str] = set()
    texts = [p.read_text(encoding="utf-8") for p in sorted(MIGRATIONS.glob("*.sql"))]
    texts += [s.text for s in py_statements()]
    for text in texts:
        tokens = _tokens(text)
        upper = [t.upper() for t in tokens]
        for i, word in enumerate(upper):
            if upper[i + 1 : i + 2] != ["TABLE"] or word not in ("CREATE", "DROP", "ALTER"):
                continue
            j = i + 2
            while upper[j] in ("IF", "NOT", "EXISTS", "ONLY"):
                j += 1
            name = _name(tokens[j])
            if word == "CREATE":
                tables.add(name)
            elif word == "DROP":
                tables.discard(name)
            elif upper[j + 1 : j + 3] == ["RENAME", "TO"]:
                tables.discard(name)
                tables.add(_name(tokens[j + 3]))
    return frozenset(tables)


def _context(path: Path) -> str | None:
    parts = path.relative_to(ROOT).parts
    return parts[2] if parts[:2] == ("libs", "common") and len(parts) > 3 else None


def _files(suffix: str) -> Iterator[Path]:
    for source in SOURCES:
        for path in sorted((ROOT / source).rglob(f"*{suffix}")):
            if MIGRATIONS not in path.parents and ".venv" not in path.parts:
                yield path


def sql_statements() -> Iterator[Statement]:
    """The named queries of every ``.sql`` file (through the project's loader)."""
    for path in _files(".sql"):
        for name, text in parse_queries(path.read_text(encoding="utf-8")).items():
            yield Statement(str(path.relative_to(ROOT)), name, _context(path), text)


def _prose(nodes: list[ast.AST]) -> set[int]:
    """The ids of the string nodes not read alone: docstrings (prose) and an f-string's parts (read with
    it)."""
    ids = set()
    for node in nodes:
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
        elif isinstance(node, ast.JoinedStr):
            ids.update(id(v) for v in node.values)
    return ids


def python_sql(source: str) -> Iterator[tuple[int, str]]:
    """The SQL texts of a Python module: its string literals (f-strings with ``{}`` for their fields) that
    read as SQL, docstrings left out."""
    nodes = list(ast.walk(ast.parse(source)))
    prose = _prose(nodes)
    for node in nodes:
        text: str | None = None
        if isinstance(node, ast.JoinedStr):
            text = "".join(str(v.value) if isinstance(v, ast.Constant) else "{}" for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            text = node.value
        if text is not None and _PY_SQL.search(text):
            assert isinstance(node, ast.expr)
            yield node.lineno, text


@functools.cache
def py_statements() -> tuple[Statement, ...]:
    """The SQL texts of every ``.py`` file (parsed once a run)."""
    return tuple(
        Statement(str(path.relative_to(ROOT)), f"line {line}", _context(path), text)
        for path in _files(".py")
        for line, text in python_sql(path.read_text(encoding="utf-8"))
    )


def owners() -> dict[str, frozenset[str]]:
    """Each context's ``OWNS``."""
    return {ctx: importlib.import_module(f"libs.common.{ctx}").OWNS for ctx in CONTEXTS}


def violations(
    statements: list[Statement],
    owned: dict[str, frozenset[str]],
    known: frozenset[str],
    allowed: dict[tuple[str, str, str], str],
) -> tuple[list[str], set[tuple[str, str, str]]]:
    """What breaks ownership (a line each, naming file, query and table), and the allow-list entries used."""
    found: list[str] = []
    used: set[tuple[str, str, str]] = set()
    for statement in statements:
        tables = parse_tables(statement.text, known)
        if statement.context is None:
            for table in sorted(tables.written | tables.read):
                found.append(f"{statement.path} {statement.name}: a service touches table {table}")
            continue
        mine = owned[statement.context]
        for table in sorted(tables.written - mine):
            found.append(
                f"{statement.path} {statement.name}: {statement.context} writes {table}, not its own"
            )
        for table in sorted(tables.read - mine):
            keys = [(statement.context, table, where) for where in (statement.where, statement.path)]
            key = next((k for k in keys if k in allowed), None)
            if key is not None:
                used.add(key)
            else:
                found.append(
                    f"{statement.path} {statement.name}: {statement.context} reads {table} of another "
                    "context (call the owner's function, or allow-list it with a reason)"
                )
    return found, used


def test_every_table_has_exactly_one_owner() -> None:
    known = schema_tables()
    owned = owners()
    claims: dict[str, list[str]] = {}
    for ctx, tables in owned.items():
        for table in tables:
            claims.setdefault(table, []).append(ctx)
    assert {t: c for t, c in claims.items() if len(c) > 1} == {}, "a table with several owners"
    assert sorted(known - claims.keys()) == [], "tables no context owns"
    assert sorted(claims.keys() - known) == [], "owned tables the migrations do not create"


def test_each_context_says_what_it_owns_in_words() -> None:
    for ctx, tables in owners().items():
        doc = importlib.import_module(f"libs.common.{ctx}").__doc__ or ""
        assert [t for t in sorted(tables) if f"``{t}``" not in doc] == [], f"{ctx}'s docstring"


def test_contexts_write_only_their_tables_and_read_others_through_their_functions() -> None:
    statements = [*sql_statements(), *py_statements()]
    assert len(statements) > 100  # the walk found the queries
    found, used = violations(statements, owners(), schema_tables(), ALLOWED_READS)
    assert found == []
    assert sorted(ALLOWED_READS.keys() - used) == [], "allow-list entries nothing needs any more"


#: The one writer of enrollments (CONTRIBUTING): ``enroll()`` inserts them, ``transitions`` changes, purges.
ENROLLMENT_WRITERS = (
    "libs/common/followups/enrollments.sql::insert_enrollment",
    "libs/common/followups/transitions.sql",
)


def test_enrollments_are_written_only_by_enroll_and_transitions() -> None:
    known = schema_tables()
    writers = {
        statement.where
        for statement in [*sql_statements(), *py_statements()]
        if "followup_enrollments" in parse_tables(statement.text, known).written
    }
    assert writers, "the walk found the writers"
    assert sorted(w for w in writers if not w.startswith(ENROLLMENT_WRITERS)) == []


_PLANTED = """
-- name: purge_outbox
-- A planted violation: retention deletes another context's rows in a CTE.
WITH gone AS (
    DELETE FROM outbox WHERE id = ANY(%(ids)s) RETURNING id
)
UPDATE followup_enrollments SET status = 'stopped' FROM contacts c, projects p
WHERE c.id = followup_enrollments.contact_id AND status IN (SELECT 'x' FROM gone)

-- name: locked_read
-- Locks and upserts are no writes of the next name; a CTE named like a table is not that table.
WITH rules AS (SELECT 1)
INSERT INTO followup_settings AS s (project_id) SELECT id FROM rules
ON CONFLICT (project_id) DO UPDATE SET project_id = s.project_id
"""


def test_the_check_catches_a_planted_violation() -> None:
    known = schema_tables()
    statements = [
        Statement("libs/common/retention/planted.sql", name, "retention", text)
        for name, text in parse_queries(_PLANTED).items()
    ]
    tables = parse_tables(statements[0].text, known)
    assert tables == Tables(
        frozenset({"outbox", "followup_enrollments"}), frozenset({"contacts", "projects"})
    )
    assert parse_tables(statements[1].text, known) == Tables(frozenset({"followup_settings"}), frozenset())
    assert parse_tables("SELECT 1 FROM contacts WHERE id = %s FOR NO KEY UPDATE", known).written == set()
    found, _ = violations(statements, owners(), known, {})
    assert found == [
        "libs/common/retention/planted.sql purge_outbox: retention writes followup_enrollments, not its own",
        "libs/common/retention/planted.sql purge_outbox: retention writes outbox, not its own",
        "libs/common/retention/planted.sql purge_outbox: retention reads contacts of another context (call "
        "the owner's function, or allow-list it with a reason)",
        "libs/common/retention/planted.sql purge_outbox: retention reads projects of another context (call "
        "the owner's function, or allow-list it with a reason)",
        "libs/common/retention/planted.sql locked_read: retention writes followup_settings, not its own",
    ]
    service = Statement("services/x/x.py", "line 1", None, "COPY contacts (id) FROM STDIN")
    assert violations([service], owners(), known, {})[0] == [
        "services/x/x.py line 1: a service touches table contacts"
    ]
    python = 'def f():\n    """UPDATE outbox: prose."""\n    return sql.SQL("INSERT INTO outbox TABLE {}")\n'
    assert [text for _, text in python_sql(python)] == ["INSERT INTO outbox TABLE {}"]


@pytest.mark.parametrize("planted", ["DELETE FROM outbox", "TRUNCATE outbox", "UPDATE ONLY outbox SET x = 1"])
def test_each_write_form_is_seen(planted: str) -> None:
    assert parse_tables(planted, schema_tables()).written == {"outbox"}


def test_the_readmes_table_of_owners_is_true() -> None:
    """The README's table of contexts names, for each, exactly the tables its ``OWNS`` lists."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| (?:\d|any) \| `(\w+)/` \| [^|]* \| ([^|]*) \|$", readme, re.MULTILINE)
    assert rows, "the README has no table of contexts"
    said = {context: frozenset(re.findall(r"`(\w+)`", tables)) for context, tables in rows}
    assert said == owners()
