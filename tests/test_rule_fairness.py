"""No project can delay or break another's automations, through the API: a project's failing match backs off
its own trigger only and the others run in the same tick; a backlog of one project does not keep another's
single trigger out of the first batch, and projects beyond a batch's walk get the next turn; a project's rules
are matched in statements PostgreSQL takes, however many parameters they would bind; a reload of the rules
compiles only what changed; and the limits of rules and condition trees are refused at save time with a 422
naming the field.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg
from litestar.testing import TestClient
from psycopg.rows import tuple_row

from libs.common.contracts.limits import MAX_CONDITION_NODES, MAX_GROUP_CHILDREN, MAX_RULES_PER_PROJECT
from libs.common.core.jobs import RoundRobin, claim_in_turns
from libs.common.core.runtime import Runtime
from libs.common.platform.projects import create_project
from libs.common.rules.rules import RULES, RuleCache
from libs.common.rules.triggers import BACKOFF_MIN, QUERIES, process_triggers
from tests.conftest import Project
from tests.factories import new_phone
from tests.helpers import rows, wait_until
from tests.rule_helpers import add_tag, create_rule, leaf
from tests.rule_trigger_helpers import new_contact, tags_of


def _as(project: Project) -> dict[str, str]:
    return project.headers


def _new_contact_of(client: TestClient[Any], project: Project) -> str:
    response = client.post("/v1/contacts", json={"phone": new_phone()}, headers=_as(project))
    assert response.status_code == 201, response.text
    contact_id: str = response.json()["id"]
    return contact_id


def _rule_of(client: TestClient[Any], project: Project, body: dict[str, Any]) -> Any:
    return client.post(
        "/v1/rules", json={"name": "r", "event": "contact.created", **body}, headers=_as(project)
    )


def _trigger(runtime: Runtime, contact_id: str) -> dict[str, Any]:
    with runtime.pool.connection() as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        [row] = cur.execute(
            "SELECT id, attempts, next_attempt_at, processed_at, outcome, last_error FROM followup_triggers"
            " WHERE contact_id = %s",
            (contact_id,),
        ).fetchall()
    return row


# --- a failing statement of one project -----------------------------------------------------------------


def test_a_projects_failing_match_backs_off_its_trigger_alone_and_the_tick_goes_on(
    client: TestClient[Any], runtime: Runtime, project: Project, other_project: Project
) -> None:
    create_rule(client, "contact.created", [add_tag("seen")])
    assert _rule_of(client, other_project, {"actions": [add_tag("seen")]}).status_code == 201
    broken = _new_contact_of(client, other_project)
    healthy = _new_contact_of(client, other_project)
    mine = new_contact(client)
    # B's contact has a lead, and its trigger a lead id its match cannot read: the statement raises
    lead = client.post(
        "/v1/events", json={"type": "lead.created", "contact_id": broken}, headers=_as(other_project)
    )
    assert lead.status_code < 300, lead.text
    with runtime.pool.connection() as conn:
        conn.execute(
            "UPDATE followup_triggers SET payload = payload || %s::jsonb WHERE contact_id = %s",
            ('{"lead_id": "not-a-uuid"}', broken),
        )

    handled = process_triggers(runtime.pool, runtime.clock, limit=100)

    assert handled.triggers == 3  # one tick
    assert tags_of(client, mine) == {"seen"}
    assert "seen" in client.get(f"/v1/contacts/{healthy}", headers=_as(other_project)).json()["tags"]
    failed = _trigger(runtime, broken)
    assert (failed["attempts"], failed["processed_at"]) == (1, None)
    assert failed["next_attempt_at"] == runtime.clock.now() + BACKOFF_MIN
    assert "InvalidTextRepresentation" in failed["last_error"]
    assert _trigger(runtime, healthy)["outcome"] == "processed"
    assert _trigger(runtime, mine)["outcome"] == "processed"


# --- fairness --------------------------------------------------------------------------------------------

BACKLOG = 300


def _backlog(runtime: Runtime, contact_id: str, count: int) -> None:
    """``count`` more triggers of the contact's one, all older than anything recorded after."""
    with runtime.pool.connection() as conn:
        conn.execute(
            "INSERT INTO followup_triggers"
            " (project_id, type, contact_id, payload, occurred_at, next_attempt_at)"
            " SELECT project_id, type, contact_id, payload, occurred_at - interval '1 hour',"
            "        next_attempt_at - interval '1 hour'"
            " FROM followup_triggers t, generate_series(1, %s) WHERE t.contact_id = %s",
            (count, contact_id),
        )


def test_one_projects_backlog_does_not_keep_anothers_trigger_out_of_the_first_batch(
    client: TestClient[Any], runtime: Runtime, project: Project, other_project: Project
) -> None:
    create_rule(client, "contact.created", [add_tag("seen")])
    assert _rule_of(client, other_project, {"actions": [add_tag("seen")]}).status_code == 201
    _backlog(runtime, _new_contact_of(client, other_project), BACKLOG)
    mine = new_contact(client)

    first = process_triggers(runtime.pool, runtime.clock, limit=50)

    assert first.triggers == 50
    assert _trigger(runtime, mine)["outcome"] == "processed"
    assert tags_of(client, mine) == {"seen"}


def _claimed(runtime: Runtime, fairness: RoundRobin, limit: int) -> list[tuple[int, Any]]:
    """What one claim takes (ids and projects), rolled back; ``fairness`` learns where it stopped."""
    with runtime.pool.connection() as conn:
        params = {"now": runtime.clock.now()} | fairness.params(limit)
        claimed = claim_in_turns(
            conn, QUERIES["trigger_shares"], QUERIES["claim_triggers"], params, tuple_row
        )
        found = [(row[0], row[3]) for row in claimed]
        conn.rollback()
    fairness.served(list(dict.fromkeys(project_id for _, project_id in found)))
    return found


def test_the_claim_shares_the_batch_among_the_projects_with_work(
    client: TestClient[Any], runtime: Runtime, project: Project, other_project: Project
) -> None:
    create_rule(client, "contact.created", [add_tag("seen")])
    assert _rule_of(client, other_project, {"actions": [add_tag("seen")]}).status_code == 201
    _backlog(runtime, _new_contact_of(client, other_project), BACKLOG)
    mine = new_contact(client)
    [(mine_id,)] = rows(runtime.pool, "SELECT id FROM followup_triggers WHERE contact_id = %s", mine)

    found = _claimed(runtime, RoundRobin(), 10)

    assert mine_id in [i for i, _ in found]
    # what A leaves of an even share goes to B: the batch is full
    assert [p for _, p in found].count(other_project.id) == 9

    # with a third project of as many due triggers as B, B takes an even share of what A leaves
    with runtime.pool.connection() as conn:
        third = create_project(conn, "third").project_id
        conn.execute(
            "INSERT INTO followup_triggers"
            " (project_id, type, contact_id, payload, occurred_at, next_attempt_at)"
            " SELECT %s, type, contact_id, payload, occurred_at, next_attempt_at FROM followup_triggers"
            " WHERE project_id = %s",
            (third, other_project.id),
        )
    taken = [p for _, p in _claimed(runtime, RoundRobin(), 10)]
    assert (taken.count(project.id), taken.count(other_project.id), taken.count(third)) == (1, 4, 4)


def test_projects_beyond_a_batchs_walk_get_the_next_turn(
    client: TestClient[Any], runtime: Runtime, project: Project, other_project: Project
) -> None:
    with runtime.pool.connection() as conn:
        third = create_project(conn, "third").project_id
    create_rule(client, "contact.created", [add_tag("seen")])
    assert _rule_of(client, other_project, {"actions": [add_tag("seen")]}).status_code == 201
    _backlog(runtime, _new_contact_of(client, other_project), 5)
    _backlog(runtime, new_contact(client), 5)
    with runtime.pool.connection() as conn:  # a third project's backlog, as if recorded
        conn.execute(
            "INSERT INTO followup_triggers"
            " (project_id, type, contact_id, payload, occurred_at, next_attempt_at)"
            " SELECT %s, type, contact_id, payload, occurred_at, next_attempt_at FROM followup_triggers"
            " WHERE project_id = %s",
            (third, project.id),
        )
    turns = RoundRobin()
    walked = [{p for _, p in _claimed(runtime, turns, 2)} for _ in range(3)]
    # two projects a batch (a batch of 2 walks at most 2 projects), one item each, the walk going round
    assert all(len(projects) == 2 for projects in walked)
    assert set.union(*walked[:2]) == {project.id, other_project.id, third}
    assert walked[0] != walked[1]


# --- a project's rules in statements PostgreSQL takes -----------------------------------------------------


def _hostile_conditions(leaves: int) -> dict[str, Any]:
    """``leaves`` attribute_changed leaves (from and to: five parameters each), in groups of the most
    children a group may have."""
    items = [
        leaf(f"contact.attributes.k{i}", "attribute_changed", {"from": i, "to": i + 1}) for i in range(leaves)
    ]
    groups = [{"all": items[i : i + MAX_GROUP_CHILDREN]} for i in range(0, len(items), MAX_GROUP_CHILDREN)]
    return {"any": groups}


def test_rules_over_the_parameter_limit_compile_apart_and_are_matched_in_statements_postgresql_takes(
    client: TestClient[Any], runtime: Runtime, project: Project, other_project: Project
) -> None:
    """B's 132 rules of 100 leaves would bind 66,000 parameters together, over PostgreSQL's 65,535. They
    compile in the background (seconds of work): meanwhile A's trigger is acted on and B's wait, due as
    they were; then B's are matched, their values written into the statements."""
    conditions = _hostile_conditions(100)
    for i in range(132):
        body = {"name": f"hostile {i}", "actions": [add_tag(f"t{i}")], "conditions": conditions}
        assert _rule_of(client, other_project, body).status_code == 201
    assert (
        _rule_of(client, other_project, {"name": "always", "actions": [add_tag("seen")]}).status_code == 201
    )
    create_rule(client, "contact.created", [add_tag("seen")])
    heavy = [_new_contact_of(client, other_project) for _ in range(3)]
    mine = new_contact(client)

    first = process_triggers(runtime.pool, runtime.clock, limit=100)

    assert first.triggers == 1
    assert _trigger(runtime, mine)["outcome"] == "processed"
    for contact_id in heavy:  # deferred, not failed
        row = _trigger(runtime, contact_id)
        assert (row["outcome"], row["attempts"], row["last_error"]) == (None, 0, None)
        assert row["next_attempt_at"] <= runtime.clock.now()

    def compiled() -> bool:
        with runtime.pool.connection() as conn:
            return RULES.ready(conn, other_project.id, "contact.created", runtime.pool) is not None

    wait_until(compiled, timeout=120, what="B's rules compiled in the background")
    assert process_triggers(runtime.pool, runtime.clock, limit=100).triggers == 3
    for contact_id in heavy:
        row = _trigger(runtime, contact_id)
        assert (row["outcome"], row["last_error"]) == ("processed", None)
        tags = client.get(f"/v1/contacts/{contact_id}", headers=_as(other_project)).json()["tags"]
        assert tags == ["seen"]  # the hostile ones did not match; the last one did


def test_a_reload_compiles_only_the_rules_that_changed(
    client: TestClient[Any], runtime: Runtime, project: Project
) -> None:
    kept = create_rule(client, "contact.created", [add_tag("a")])
    changed = create_rule(client, "contact.created", [add_tag("b")])
    cache = RuleCache(ttl=0)  # every read loads again
    with runtime.pool.connection() as conn:
        first = {rule.id: rule for rule in cache.rules(conn, project.id, "contact.created")}
    response = client.patch(f"/v1/rules/{changed}", json={"actions": [add_tag("c")]})
    assert response.status_code == 200, response.text
    with runtime.pool.connection() as conn:
        second = {rule.id: rule for rule in cache.rules(conn, project.id, "contact.created")}
    kept_id, changed_id = uuid.UUID(kept), uuid.UUID(changed)
    assert second[kept_id] is first[kept_id]  # the same compiled rule, not compiled again
    assert second[changed_id] is not first[changed_id]
    assert second[changed_id].actions != first[changed_id].actions


# --- limits at save time ----------------------------------------------------------------------------------


def _errors(response: Any) -> dict[str, str]:
    assert response.status_code == 422, response.text
    return {e["field"]: e["message"] for e in response.json()["errors"]}


def test_a_group_with_more_children_than_the_limit_is_refused_naming_it(
    client: TestClient[Any], project: Project
) -> None:
    children = [leaf("contact.tags", "contains", f"t{i}") for i in range(MAX_GROUP_CHILDREN + 1)]
    errors = _errors(
        _rule_of(client, project, {"actions": [add_tag("x")], "conditions": {"all": [{"any": children}]}})
    )
    assert list(errors) == ["conditions.all.0.any"]
    assert str(MAX_GROUP_CHILDREN) in errors["conditions.all.0.any"]
    ok = [leaf("contact.tags", "contains", f"t{i}") for i in range(MAX_GROUP_CHILDREN)]
    assert (
        _rule_of(client, project, {"actions": [add_tag("x")], "conditions": {"any": ok}}).status_code == 201
    )


def test_a_tree_of_more_nodes_than_the_limit_is_refused_naming_the_node_over_it(
    client: TestClient[Any], project: Project
) -> None:
    # 1 + 50 x (a group, a group in it with a leaf, a leaf): 201 nodes, 100 leaves
    group = {"all": [{"all": [leaf("contact.tags", "contains", "a")]}, leaf("contact.tags", "contains", "b")]}
    tree = {"any": [group] * 50}
    errors = _errors(_rule_of(client, project, {"actions": [add_tag("x")], "conditions": tree}))
    assert list(errors) == ["conditions.any.49.all.1"]
    assert str(MAX_CONDITION_NODES) in errors["conditions.any.49.all.1"]
    tree = {"any": [group] * 49 + [{"all": [leaf("contact.tags", "contains", "b")]}]}
    assert _rule_of(client, project, {"actions": [add_tag("x")], "conditions": tree}).status_code == 201


def test_a_tree_of_150000_empty_groups_is_refused(client: TestClient[Any], project: Project) -> None:
    body = {
        "name": "r",
        "event": "contact.created",
        "actions": [add_tag("x")],
        "conditions": {"any": [{"all": []}] * 150_000},
    }
    content = json.dumps(body)
    assert len(content) > 1_500_000
    response = client.post(
        "/v1/rules", content=content, headers=_as(project) | {"content-type": "application/json"}
    )
    assert list(_errors(response)) == ["conditions.any"]
    assert client.get("/v1/rules", headers=_as(project)).json()["items"] == []


def test_a_project_holds_at_most_the_limit_of_rules(
    client: TestClient[Any], runtime: Runtime, project: Project, other_project: Project
) -> None:
    create_rule(client, "contact.created", [add_tag("x")])
    with runtime.pool.connection() as conn:  # the rest of the limit, as the API would have made them
        conn.execute(
            "INSERT INTO rules (project_id, name, event, conditions, actions, execution_delay_minutes,"
            "                   delay_in_business_hours, active, position, created_at, updated_at)"
            " SELECT project_id, name || n, event, conditions, actions, execution_delay_minutes,"
            "        delay_in_business_hours, false, position + n, created_at, updated_at"
            " FROM rules, generate_series(1, %s) AS n WHERE project_id = %s",
            (MAX_RULES_PER_PROJECT - 1, project.id),
        )
    errors = _errors(_rule_of(client, project, {"actions": [add_tag("x")]}))
    assert list(errors) == ["body"] and str(MAX_RULES_PER_PROJECT) in errors["body"]
    # another project is not counted with it
    assert _rule_of(client, other_project, {"actions": [add_tag("x")]}).status_code == 201
    # a rule deleted makes room again
    [(rule_id,)] = rows(runtime.pool, "SELECT id FROM rules WHERE project_id = %s LIMIT 1", project.id)
    assert client.delete(f"/v1/rules/{rule_id}").status_code == 204
    assert _rule_of(client, project, {"actions": [add_tag("x")]}).status_code == 201


def test_rules_that_fail_to_compile_in_the_background_back_off_their_projects_triggers_only(
    client: TestClient[Any], runtime: Runtime, project: Project, other_project: Project
) -> None:
    conditions = _hostile_conditions(60)
    for i in range(3):  # more nodes together than are compiled in the claim's own transaction
        body = {"name": f"big {i}", "actions": [add_tag(f"t{i}")], "conditions": conditions}
        assert _rule_of(client, other_project, body).status_code == 201
    create_rule(client, "contact.created", [add_tag("seen")])
    with runtime.pool.connection() as conn:  # a stored tree that no longer reads (as a bad migration would)
        conn.execute(
            "UPDATE rules SET conditions = %s WHERE project_id = %s AND name = 'big 2'",
            ('{"any": [{"all": 5}]}', other_project.id),
        )
    RULES.invalidate(other_project.id)
    theirs = _new_contact_of(client, other_project)
    mine = new_contact(client)

    assert process_triggers(runtime.pool, runtime.clock, limit=100).triggers == 1  # B's compiles apart
    assert _trigger(runtime, mine)["outcome"] == "processed"

    def settled() -> bool:
        process_triggers(runtime.pool, runtime.clock, limit=100)
        return bool(_trigger(runtime, theirs)["attempts"] == 1)

    wait_until(settled, timeout=60, what="B's trigger backed off")
    failed = _trigger(runtime, theirs)
    assert failed["processed_at"] is None and "InvalidInput" in failed["last_error"]
    assert failed["next_attempt_at"] == runtime.clock.now() + BACKOFF_MIN
