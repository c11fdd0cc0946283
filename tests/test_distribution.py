"""Every tenant table is distributed by project (issue 26; docs/scaling.md), and this test holds the schema
and the statements to it, as a Citus cluster would.

(a) The catalog of a migrated database: every primary key, unique constraint and unique index of a tenant
    table (every table but :data:`~libs.common.core.distribution.REFERENCE_TABLES`) has ``project_id`` as its
    first column, every foreign key between two tenant tables has it first on both sides, and every tenant
    table has a NOT NULL ``project_id``.
(b) Every statement (the named queries of every ``.sql`` file, read through the project's loader, and every
    SQL text of a ``.py`` file, as ``tests/test_table_ownership.py`` finds them): each reference to a tenant
    table is tied, by equalities on ``project_id``, to a bound parameter (``x.project_id = %(project_id)s``,
    or ``y.project_id = x.project_id`` with ``x`` tied so: a co-located join); an insert names the
    project_id of its rows. ``project_id = ANY(...)`` ties nothing. The claims that walk several projects
    are the known exceptions (:data:`EXCEPTIONS`, each with its reason); a new statement that walks
    projects fails here until it is listed.
(c) The plans of the hottest by-id statements: the project_id condition is an index condition (the
    statement would be routed to one shard, and on it reads one index entry).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import ConnectionPool

from libs.common.core.db import create_pool
from libs.common.core.distribution import DISTRIBUTION_COLUMN, REFERENCE_TABLES
from libs.common.core.settings import DatabaseSettings
from libs.common.core.sql import load_queries
from libs.common.platform import send_lane
from libs.common.platform.conditions import SEGMENT_CONTEXT
from libs.common.platform.projects import create_project
from libs.common.rules import bulk
from libs.common.rules.matching import evaluation_statement, matching_statement
from tests.conftest import database_from, with_database
from tests.test_retention_plans import _seed as seed_retention
from tests.test_table_ownership import Statement, py_statements, schema_tables, sql_statements

# --- (a) the catalog ------------------------------------------------------------------------------------

#: Each primary key, unique constraint and unique index of the public schema: its table, name and columns.
_UNIQUE_KEYS = """
SELECT c.relname, i.relname, array_agg(a.attname ORDER BY k.n)
FROM pg_index x
JOIN pg_class c ON c.oid = x.indrelid AND c.relnamespace = 'public'::regnamespace
JOIN pg_class i ON i.oid = x.indexrelid
CROSS JOIN LATERAL unnest(x.indkey) WITH ORDINALITY AS k(attnum, n)
LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum
WHERE x.indisunique
GROUP BY c.relname, i.relname
"""

#: Each foreign key: its table, name, columns, and the table and columns it references.
_FOREIGN_KEYS = """
SELECT c.relname, f.conname,
       ARRAY(SELECT a.attname FROM unnest(f.conkey) WITH ORDINALITY k(n, i)
             JOIN pg_attribute a ON a.attrelid = f.conrelid AND a.attnum = k.n ORDER BY k.i),
       r.relname,
       ARRAY(SELECT a.attname FROM unnest(f.confkey) WITH ORDINALITY k(n, i)
             JOIN pg_attribute a ON a.attrelid = f.confrelid AND a.attnum = k.n ORDER BY k.i)
FROM pg_constraint f
JOIN pg_class c ON c.oid = f.conrelid
JOIN pg_class r ON r.oid = f.confrelid
WHERE f.contype = 'f' AND f.connamespace = 'public'::regnamespace
"""

_TABLES = """
SELECT c.relname, a.attnotnull
FROM pg_class c
LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = %s AND NOT a.attisdropped
WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p')
"""


def tenant_tables(conn: psycopg.Connection[Any]) -> dict[str, bool | None]:
    """Every tenant table, with whether its project_id is NOT NULL (None: it has none)."""
    rows = conn.execute(_TABLES, (DISTRIBUTION_COLUMN,)).fetchall()
    return {table: not_null for table, not_null in rows if table not in REFERENCE_TABLES}


def test_the_reference_tables_are_tables_of_the_schema(db_url: str) -> None:
    with psycopg.connect(db_url) as conn:
        tables = {row[0] for row in conn.execute(_TABLES, (DISTRIBUTION_COLUMN,))}
    assert sorted(REFERENCE_TABLES.keys() - tables) == []
    assert all(reason.strip() for reason in REFERENCE_TABLES.values())


def test_every_tenant_table_has_a_project_id_it_cannot_lack(db_url: str) -> None:
    with psycopg.connect(db_url) as conn:
        tables = tenant_tables(conn)
    assert len(tables) > 20  # the walk read the schema
    assert sorted(t for t, not_null in tables.items() if not not_null) == []


def test_project_id_leads_every_key_of_a_tenant_table(db_url: str) -> None:
    """Citus: a primary key or unique constraint of a distributed table includes the distribution column;
    here it leads, so the key is also the project's index of the rows."""
    with psycopg.connect(db_url) as conn:
        tenants = tenant_tables(conn)
        keys = conn.execute(_UNIQUE_KEYS).fetchall()
    assert len(keys) > 30
    broken = [
        f"{table}.{name} ({', '.join(str(c) for c in columns)})"
        for table, name, columns in keys
        if table in tenants and columns[0] != DISTRIBUTION_COLUMN
    ]
    assert broken == []


def test_every_foreign_key_between_tenant_tables_is_within_the_project(db_url: str) -> None:
    """Citus: a foreign key between distributed tables must be between co-located tables on the
    distribution column; one to a reference table (projects, api_keys) is allowed as it is."""
    with psycopg.connect(db_url) as conn:
        tenants = tenant_tables(conn)
        keys = conn.execute(_FOREIGN_KEYS).fetchall()
    between = [k for k in keys if k[0] in tenants and k[3] in tenants]
    assert len(between) > 20
    broken = [
        f"{table}.{name}: ({', '.join(columns)}) -> {target} ({', '.join(referenced)})"
        for table, name, columns, target, referenced in between
        if columns[0] != DISTRIBUTION_COLUMN or referenced[0] != DISTRIBUTION_COLUMN
    ]
    assert broken == []
    # and no reference table points at a tenant table (Citus refuses it)
    assert [k[1] for k in keys if k[0] in REFERENCE_TABLES and k[3] in tenants] == []


#: How docs/scaling.md tells an operator to distribute the tables.
SCALING = Path(__file__).resolve().parent.parent / "docs" / "scaling.md"
_CALL = re.compile(r"SELECT (create_reference_table|create_distributed_table)\('(\w+)'(?:, '(\w+)')?")
_DROPPED = re.compile(r"ALTER TABLE (\w+) DROP CONSTRAINT (\w+);")


def test_the_scaling_docs_distribute_every_table_in_an_order_its_foreign_keys_allow(db_url: str) -> None:
    """docs/scaling.md's calls name each table once: the reference tables as REFERENCE_TABLES says, every
    other table distributed by project_id, each after the tables its foreign keys point at (but a key the
    docs drop first and add back after)."""
    text = SCALING.read_text(encoding="utf-8")
    assert "REFERENCE_TABLES" in text and "libs/common/core/distribution.py" in text
    calls = _CALL.findall(text)
    named = [table for _, table, _ in calls]
    assert len(named) == len(set(named)), "a table is named twice"
    with psycopg.connect(db_url) as conn:
        tenants = tenant_tables(conn)
        keys = conn.execute(_FOREIGN_KEYS).fetchall()
    assert {t for kind, t, _ in calls if kind == "create_reference_table"} == REFERENCE_TABLES.keys()
    distributed = [(t, column) for kind, t, column in calls if kind == "create_distributed_table"]
    assert {t for t, _ in distributed} == tenants.keys()
    assert {column for _, column in distributed} == {DISTRIBUTION_COLUMN}
    dropped = {name for _, name in _DROPPED.findall(text)}
    order = {table: i for i, table in enumerate(named)}
    late = [
        f"{table}.{name} -> {target}"
        for table, name, _, target, _ in keys
        if name not in dropped and order[target] > order[table]
    ]
    assert late == []
    for table in REFERENCE_TABLES:
        assert f"| `{table}` |" in text, f"docs/scaling.md's table of reference tables lacks {table}"


# --- (b) the statements ---------------------------------------------------------------------------------

_UNLOCKED = "no row locked: a multi-shard read or set-based write, which Citus runs on every node"
_LANE = f"the send lane's batch of numbers, by (project, number) keys ({_UNLOCKED})"
#: A claim's walk across projects: read without locks (a multi-shard read is allowed), it names the projects
#: whose own claims follow, each with an equality on project_id.
_WALK = f"the walk across projects before each project's own claim ({_UNLOCKED})"

#: The statements on tenant tables without an equality on project_id, each with its reason: the walks
#: before the claims by project, and the other statements across projects that lock no row (none takes a
#: row lock across projects: every claim is one project's), and the few lookups that cannot know the
#: project yet. A key is ``path::query`` (a named query) or ``path::`` and a piece of the statement's text
#: (a ``.py`` statement).
EXCEPTIONS: dict[str, str] = {
    # across projects, no row locked
    "libs/common/followups/release_claim.sql::due_projects": _WALK,
    "libs/common/followups/release_claim.sql::next_due": f"the release loop's sleep: every project's next "
    f"due time ({_UNLOCKED})",
    "libs/common/rules/triggers.sql::trigger_shares": _WALK,
    "libs/common/rules/executions.sql::due_shares": _WALK,
    "libs/common/rules/executions.sql::count_pending": f"the pending gauge, every project's ({_UNLOCKED})",
    "libs/common/rules/bulk.sql::next_jobs": _WALK,
    "libs/common/platform/send_lane.sql::queued_shares": _WALK,
    "libs/common/channels/send_lane.sql::channels_in_turn": _WALK,
    "libs/common/rules/webhooks.sql::due_deliveries": f"the due deliveries, each then claimed by (project, "
    f"id) ({_UNLOCKED})",
    "libs/common/rules/webhooks.sql::give_up_exhausted": f"swept with the deliveries' claim ({_UNLOCKED})",
    "libs/common/core/outbox.sql::unpublished_events": f"the outbox relay, one at a time ({_UNLOCKED})",
    "libs/common/core/outbox.sql::mark_published": f"the outbox relay's batch ({_UNLOCKED})",
    "libs/common/core/outbox.sql::oldest_unpublished_age": f"the outbox relay's lag gauge ({_UNLOCKED})",
    "libs/common/platform/send_lane.sql::queued_per_number": _LANE,
    "libs/common/channels/send_lane.sql::expire_leases": f"{_LANE}: its numbers' batch",
    "libs/common/channels/send_lane.sql::expired_sends": f"{_LANE}: its numbers' batch",
    "libs/common/channels/send_lane.sql::start_sends": f"{_LANE}: its messages' batch",
    "libs/common/channels/send_lane.sql::served": f"{_LANE}: its numbers' batch",
    # the project is not known yet
    "libs/common/channels/setup.sql::channel_of_webhook": "a provider's webhook names only its number (the "
    "URL set at the provider): the one lookup of a number's channel across projects, by the number's index; "
    "the request then runs in the project it found",
}

#: Statements that start a statement (anything else is a fragment of one, composed in the code).
_STATEMENT = re.compile(r"^\s*\(?\s*(SELECT|WITH|INSERT|UPDATE|DELETE|COPY|TRUNCATE|VALUES)\b", re.IGNORECASE)
_COMMENT = re.compile(r"--[^\n]*")
_STRING = re.compile(r"'(?:[^']|'')*'")
_DOLLAR = re.compile(r"\$\$.*?\$\$", re.DOTALL)
#: A bound parameter: ``%(name)s``, ``%s`` or ``$n``, with a cast.
_PARAM = re.compile(r"(?:%\((\w+)\)s|%s|\$\d+)(?:::\w+(?:\[\])?)?")
_CAST = re.compile(r"::\w+(?:\[\])?")
_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*(?:\.[A-Za-z_][A-Za-z0-9_$]*)?|\?|\S")
#: One side of an equality on project_id: ``x.project_id``, ``project_id`` or a parameter (``?``).
_SIDE = r"(?:(?<![\w.])(?:(\w+)\.)?project_id\b|(\?))"
_EQUALITY = re.compile(rf"{_SIDE}\s*=\s*{_SIDE}")
#: What makes the equality after it optional.
_OPTIONAL = re.compile(r"\?\s+IS\s+NULL\s+OR\s+$", re.IGNORECASE)
#: Words after a table name that are not its alias.
_NOT_ALIAS = {
    "WHERE", "JOIN", "LEFT", "RIGHT", "INNER", "FULL", "CROSS", "ON", "USING", "GROUP", "ORDER", "LIMIT",
    "FOR", "RETURNING", "SET", "UNION", "HAVING", "WINDOW", "OFFSET", "NATURAL", "EXCEPT", "INTERSECT",
    "FETCH", "VALUES", "SELECT", "AND", "OR", "TO", "WITH", "FROM", "DEFAULT", "ALL",
}  # fmt: skip


@dataclass
class Reference:
    """One place a statement names a tenant table."""

    table: str
    #: The name the statement calls it by (its alias, else the table's name).
    qualifier: str
    #: Whether it is written to by an INSERT or COPY (its rows name their project in a column).
    inserted: bool = False
    #: Whether it is a COPY's (its rows are written by the code: they name their project).
    copied: bool = False
    #: An inserted table's column list names project_id.
    names_project: bool = False
    #: What an INSERT ... SELECT writes into project_id (its select list's item: ``?``, ``x.project_id``),
    #: or None (VALUES: a row each, as given).
    source: str | None = None


@dataclass
class Verdict:
    """What a statement lacks: the references not tied to a project parameter (empty: it is routable)."""

    untied: list[str] = field(default_factory=list)


def _normalized(text: str) -> str:
    """The statement without comments and literals, each parameter as ``?``, casts dropped."""
    text = _DOLLAR.sub("''", _STRING.sub("''", _COMMENT.sub(" ", text)))
    return _CAST.sub("", _PARAM.sub("?", text))


def references(text: str, tenants: frozenset[str]) -> list[Reference]:
    """Every reference to a tenant table in a (normalized) statement, with its qualifier."""
    tokens = _TOKEN.findall(text)
    upper = [t.upper() for t in tokens]
    ctes = {
        tokens[i].lower()
        for i in range(1, len(tokens) - 2)
        if upper[i - 1] in ("WITH", "RECURSIVE", ",") and upper[i + 1] == "AS" and tokens[i + 2] == "("
    }
    found: list[Reference] = []

    def at(i: int, *, inserted: bool = False, copied: bool = False) -> int | None:
        """The reference at token ``i`` (None: no tenant table); returns the index after its alias."""
        while i < len(tokens) and upper[i] in ("ONLY", "LATERAL"):
            i += 1
        if i >= len(tokens):
            return None
        name = tokens[i].lower().removeprefix("public.")
        if (
            name not in tenants
            or name in ctes
            or (i + 1 < len(tokens) and tokens[i + 1] == "(" and not inserted)
        ):
            return None
        j = i + 1
        if j < len(tokens) and upper[j] == "AS":
            j += 1
        alias = name
        if j < len(tokens) and re.fullmatch(r"[A-Za-z_]\w*", tokens[j]) and upper[j] not in _NOT_ALIAS:
            alias = tokens[j].lower()
            j += 1
        ref = Reference(name, alias, inserted=inserted, copied=copied)
        if inserted and j < len(tokens) and tokens[j] == "(":
            columns, k = _items(tokens, j + 1)
            ref.names_project = DISTRIBUTION_COLUMN in columns
            if ref.names_project and k + 1 < len(tokens) and upper[k + 1] == "SELECT":
                values, _ = _items(tokens, k + 2)
                position = columns.index(DISTRIBUTION_COLUMN)
                ref.source = values[position] if position < len(values) else ""
        found.append(ref)
        return j

    for i, word in enumerate(upper):
        before = upper[i - 1] if i else ""
        if (word, upper[i + 1] if i + 1 < len(upper) else "") == ("INSERT", "INTO"):
            at(i + 2, inserted=True)
        elif word == "COPY":
            at(i + 1, inserted=True, copied=True)
        elif word in ("UPDATE", "TRUNCATE") and before not in ("DO", "FOR", "KEY"):
            at(i + 1)
        elif word in ("FROM", "JOIN", "USING"):
            j = at(i + 1)
            while j is not None and j < len(tokens) and tokens[j] == ",":
                j = at(j + 1)
    return found


def _items(tokens: list[str], i: int) -> tuple[list[str], int]:
    """The comma-separated items from token ``i`` on (a column list up to its ``)``, a select list up to its
    FROM), each its words joined without its ``AS`` alias; and the index where they end."""
    items: list[str] = []
    current: list[str] = []
    depth = 0
    while i < len(tokens):
        token = tokens[i]
        if depth == 0 and (token == ")" or token.upper() in ("FROM", "WHERE", "ON", "RETURNING")):
            break
        depth += {"(": 1, ")": -1}.get(token, 0)
        if depth == 0 and token == ",":
            items.append(" ".join(current))
            current = []
        else:
            current.append(token.lower())
        i += 1
    items.append(" ".join(current))
    return [re.sub(r" as \w+$", "", item) for item in items], i


#: The SQL functions that walk the projects of a queue table (named by their first argument) across
#: projects: a call reads that table, never tied to one project.
_WALKING = re.compile(r"\b(?:projects_in_turn|project_shares)\s*\(\s*'(\w+)'", re.IGNORECASE)


def verdict(text: str, tenants: frozenset[str]) -> Verdict:
    """Whether each tenant reference of a statement is tied, by equalities on project_id, to a bound
    parameter (a fragment, composed with others in the code, need only be joined on project_id)."""
    normalized = _normalized(text)
    refs = references(normalized, tenants)
    walked = [table for table in _WALKING.findall(_COMMENT.sub(" ", text)) if table in tenants]
    fragment = not _STATEMENT.match(normalized)
    # the equalities: a graph over qualifiers ("" is a bare project_id) and "?" (a parameter)
    parent: dict[str, str] = {}

    def find(node: str) -> str:
        parent.setdefault(node, node)
        while parent[node] != node:
            node = parent[node]
        return node

    def union(a: str, b: str) -> None:
        parent[find(a)] = find(b)

    counted: Counter[str] = Counter()
    for match in _EQUALITY.finditer(normalized):
        if _OPTIONAL.search(normalized[: match.start()]):
            continue  # (? IS NULL OR project_id = ?): every project's rows when the parameter is null
        left = "?" if match.group(2) else (match.group(1) or "").lower()
        right = "?" if match.group(4) else (match.group(3) or "").lower()
        union(left, right)
        counted.update({left, right} - {"?"})
    for ref in refs:
        if ref.qualifier == ref.table:  # not aliased: a bare project_id is its too
            union(ref.table, "")
    untied: list[str] = [f"{table} (walked across projects)" for table in walked]
    needed: Counter[str] = Counter()
    for ref in refs:
        if ref.inserted:
            if not ref.names_project:
                untied.append(f"{ref.table} (inserted without a project_id)")
            elif ref.source is not None and not fragment and not _given(ref.source, find):
                untied.append(f"{ref.table} (inserted with the project_id {ref.source!r})")
            continue
        key = "" if ref.qualifier == ref.table else ref.qualifier
        needed[key] += 1
        anchored = find(ref.qualifier) == find("?") if not fragment else counted[key] + counted[ref.table] > 0
        if not anchored:
            untied.append(f"{ref.table} {ref.qualifier}")
    # a qualifier used twice (an alias in two subqueries) needs an equality for each use
    for key, uses in needed.items():
        equalities = counted[key] + (
            sum(counted[r.table] for r in refs if r.qualifier == r.table) if not key else 0
        )
        if 0 < equalities < uses:
            untied.append(
                f"{key or 'an unaliased table'} ({uses} uses, {equalities} equalities on project_id)"
            )
    return Verdict(untied)


def _given(source: str, find: Callable[[str], str]) -> bool:
    """Whether what an INSERT ... SELECT writes into project_id is tied to a parameter."""
    if source == "?":
        return True
    qualified = re.fullmatch(r"(?:(\w+) \. )?project_id|(\w+)\.project_id", source)
    if qualified is None:
        return False
    return find((qualified.group(1) or qualified.group(2) or "").lower()) == find("?")


#: Statements composed of pieces in the code (checked whole, under their composed names): the send lane's
#: claims, the rules' matching over a trigger's context (and a dry run's reading of one), a segment's
#: contacts written as a job's.
COMPOSED = {
    "send_lane.CLAIM_QUEUED_MESSAGES": send_lane.CLAIM_QUEUED_MESSAGES,
    "send_lane.CLAIM_QUEUED_FOR_NUMBERS": send_lane.CLAIM_QUEUED_FOR_NUMBERS,
    "matching.matching_statement": matching_statement(["true"]),
    "matching.evaluation_statement": evaluation_statement([(["true"], ["to_jsonb(c.name)"])]),
    "bulk.SEGMENT_ITEMS": bulk.SEGMENT_ITEMS.format(SEGMENT_CONTEXT, sql.SQL("true")).as_string(),
}


def _key(statement: Statement) -> str:
    return f"{statement.path}::{statement.name}"


def _exception(statement: Statement) -> str | None:
    key = _key(statement)
    if key in EXCEPTIONS:
        return key
    if statement.path.endswith(".py"):
        for known in EXCEPTIONS:
            path, _, piece = known.partition("::")
            if path == statement.path and piece and piece in statement.text:
                return known
    return None


def tenant_table_names() -> frozenset[str]:
    return frozenset(schema_tables() - REFERENCE_TABLES.keys())


def all_statements() -> Iterator[Statement]:
    yield from sql_statements()
    yield from py_statements()
    for name, text in COMPOSED.items():
        yield Statement(name, "", "platform", text)


def test_every_statement_has_an_equality_on_project_id() -> None:
    tenants = tenant_table_names()
    statements = list(all_statements())
    assert len(statements) > 150  # the walk found the queries
    found, used = [], set()
    for statement in statements:
        result = verdict(statement.text, tenants)
        if not result.untied:
            continue
        known = _exception(statement) or (statement.path if statement.path in EXCEPTIONS else None)
        if known is not None:
            used.add(known)
            continue
        found.append(f"{_key(statement)}: {', '.join(result.untied)}")
    assert found == [], "statements on tenant tables without an equality on project_id:\n" + "\n".join(found)
    assert sorted(EXCEPTIONS.keys() - used) == [], "exceptions nothing needs any more"


@pytest.mark.parametrize(
    ("text", "untied"),
    [
        ("SELECT * FROM messages WHERE project_id = %(project_id)s AND id = %(id)s", []),
        ("SELECT * FROM messages WHERE id = %(id)s", ["messages messages"]),
        ("SELECT * FROM messages m WHERE m.project_id = ANY(%(ids)s)", ["messages m"]),
        (
            "SELECT * FROM messages m JOIN contacts c ON c.id = m.contact_id WHERE m.project_id = %s",
            ["contacts c"],
        ),
        (
            "SELECT * FROM messages m JOIN contacts c ON c.project_id = m.project_id AND c.id = m.contact_id"
            " WHERE m.project_id = $1",
            [],
        ),
        (
            "SELECT (SELECT 1 FROM messages m WHERE m.id = c.id), (SELECT 1 FROM messages m"
            " WHERE m.project_id = c.project_id) FROM contacts c WHERE c.project_id = %(project_id)s",
            ["m (2 uses, 1 equalities on project_id)"],
        ),
        ("INSERT INTO outbox (project_id, type) VALUES (%(project_id)s, 'x')", []),
        (
            "SELECT project_id, share FROM project_shares('messages', $$q.status = 'QUEUED'$$, %(after)s)",
            ["messages (walked across projects)"],
        ),
        ("INSERT INTO outbox (type) VALUES (%(type)s)", ["outbox (inserted without a project_id)"]),
        (
            "UPDATE followup_triggers SET x = 1 FROM unnest(%(p)s::uuid[], %(i)s::bigint[])"
            " AS k(project_id, id) WHERE followup_triggers.project_id = k.project_id",
            ["followup_triggers followup_triggers"],
        ),
    ],
)
def test_the_check_tells_a_routable_statement_from_one_that_is_not(text: str, untied: list[str]) -> None:
    assert verdict(text, tenant_table_names()).untied == untied


# --- (c) the plans --------------------------------------------------------------------------------------

#: The hottest by-id statements, each with the tenant table it reads or writes by key: its equality on
#: project_id must be an index condition (so, on a cluster, the statement is routed to one shard, and there
#: it finds its row through the project's part of an index: the table's key, or a project-led partial index
#: the planner finds closer to the statement's conditions).
BY_ID = [
    ("libs.common.followups/enrollments.sql", "lock_enrollment", "followup_enrollments"),
    ("libs.common.followups/transitions.sql", "advance", "followup_enrollments"),
    ("libs.common.followups/release_claim.sql", "lock_fenced", "followup_enrollments"),
    ("libs.common.followups/release_state.sql", "release_state", "contacts"),
    ("libs.common.platform/contacts.sql", "lock_contact", "contacts"),
    ("libs.common.platform/send_lane.sql", "set_message_status", "messages"),
    ("libs.common.rules/rules.sql", "get_rule", "rules"),
    ("libs.common.rules/triggers.sql", "lock_leased", "followup_triggers"),
    ("libs.common.rules/executions.sql", "lock_leased", "rule_pending_executions"),
    ("libs.common.rules/webhooks.sql", "claim_delivery", "webhook_deliveries"),
    ("libs.common.rules/bulk.sql", "get_job", "followup_bulk_jobs"),
]


@pytest.fixture(scope="module")
def seeded_database(server_url: str, template_db: str) -> Iterator[str]:
    """A database of its own with a project's rows in the tables the plans read (the retention plans'
    seed, and messages), analyzed: the planner chooses as it would with data."""
    with database_from(server_url, template_db) as name:
        pool = create_pool(DatabaseSettings(url=with_database(server_url, name)), name="followups-seed")
        try:
            with pool.connection() as conn:
                project = create_project(conn, "distribution plans")
            seed_retention(pool, project.project_id)
            with pool.connection() as conn:
                conn.execute(
                    "INSERT INTO messages (project_id, contact_id, direction, status, source, body)"
                    " SELECT project_id, id, 'outbound', 'SENT', 'followup', 'hello' FROM contacts"
                )
                conn.execute("ANALYZE messages")
        finally:
            pool.close()  # a template database must have no session open when it is copied
        yield name


@pytest.fixture
def db_url(server_url: str, seeded_database: str) -> Iterator[str]:
    """This module's tests run on a copy of the seeded database (migrated, as the others' template)."""
    with database_from(server_url, seeded_database) as name:
        yield with_database(server_url, name)


def _plan_nodes(plan: Any) -> Iterator[dict[str, Any]]:
    if isinstance(plan, list):
        for item in plan:
            yield from _plan_nodes(item)
    elif isinstance(plan, dict):
        if "Node Type" in plan:
            yield plan
        for key in ("Plan", "Plans"):
            if key in plan:
                yield from _plan_nodes(plan[key])


@pytest.mark.parametrize(("where", "name", "table"), BY_ID, ids=[f"{w}:{n}" for w, n, _ in BY_ID])
def test_the_hottest_by_id_statements_find_their_row_by_project_and_id(
    pool: ConnectionPool, where: str, name: str, table: str
) -> None:
    """The generic plan (what a prepared statement comes to use, parameters unknown) reads the table through
    an index whose condition holds the equality on project_id. (Sequential scans are off: some of the
    seeded tables hold a row or two, and what is checked is how an index is used.)"""
    package, filename = where.split("/")
    statement = load_queries(package, filename)[name]
    numbers: dict[str, int] = {}
    generic = re.sub(
        r"%\((\w+)\)s", lambda m: f"${numbers.setdefault(m.group(1), len(numbers) + 1)}", statement
    )
    with pool.connection() as conn, conn.transaction(force_rollback=True):
        conn.execute("SET LOCAL enable_seqscan = off")
        row = conn.execute(f"EXPLAIN (GENERIC_PLAN, FORMAT JSON) {generic}".replace("%", "%%")).fetchone()
    assert row is not None
    scans = [
        n
        for n in _plan_nodes(row[0])
        if n.get("Relation Name") == table and n["Node Type"] not in ("ModifyTable", "LockRows")
    ]
    assert scans, row[0]
    for scan in scans:
        condition = scan.get("Index Cond") or scan.get("Recheck Cond") or ""
        assert DISTRIBUTION_COLUMN in condition, scan
