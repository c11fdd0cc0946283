"""Contacts over the REST API: the happy paths, and every kind of bad input answered as problem details."""

from __future__ import annotations

import uuid
from typing import Any
from urllib.parse import quote

import pytest
from litestar.testing import TestClient
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from tests.conftest import Project

PROBLEM_JSON = "application/problem+json"
PHONE = "+14155550123"


# --- helpers


def assert_problem(response: Any, status: int, field: str | None = None) -> dict[str, Any]:
    """``response`` is a problem-details body with ``status``, naming ``field`` in ``errors`` if given."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM_JSON)
    body: dict[str, Any] = response.json()
    assert body["status"] == status
    assert body["type"]
    assert body["title"]
    assert isinstance(body["detail"], str) and body["detail"]
    if field is not None:
        fields = [error["field"] for error in body.get("errors", [])]
        assert field in fields, body
        assert all(error["message"] for error in body["errors"])
    return body


def create(client: TestClient[Any], **body: Any) -> dict[str, Any]:
    response = client.post("/v1/contacts", json={"phone": PHONE, **body})
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created


def stored(pool: ConnectionPool, contact_id: str | uuid.UUID) -> dict[str, Any] | None:
    """The contact's row as stored, straight from the database."""
    with pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        return cur.execute("SELECT * FROM contacts WHERE id = %s", (str(contact_id),)).fetchone()


def stored_count(pool: ConnectionPool, project: Project) -> int:
    with pool.connection() as conn:
        row = conn.execute("SELECT count(*) FROM contacts WHERE project_id = %s", (project.id,)).fetchone()
    assert row is not None
    count: int = row[0]
    return count


def by_phone(phone: str) -> str:
    return "/v1/contacts/by-phone/" + quote(phone, safe="")


# --- create


def test_create_normalises_the_phone_and_stores_every_field(
    client: TestClient[Any], pool: ConnectionPool, project: Project
) -> None:
    response = client.post(
        "/v1/contacts",
        json={
            "phone": "+1 415-555 (0123)",
            "name": "Ada",
            "timezone": "Europe/Lisbon",
            "attributes": {"plan": "pro", "seats": 3, "meta": {"source": "web"}},
            "tags": ["vip", " lead ", "vip"],
        },
    )
    assert response.status_code == 201, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert body["phone"] == PHONE
    assert body["name"] == "Ada"
    assert body["timezone"] == "Europe/Lisbon"
    assert body["attributes"] == {"plan": "pro", "seats": 3, "meta": {"source": "web"}}
    assert body["tags"] == ["lead", "vip"]
    assert body["consent"] == "unknown"
    assert body["opted_out_at"] is None
    uuid.UUID(body["id"])

    row = stored(pool, body["id"])
    assert row is not None
    assert row["project_id"] == project.id
    assert row["phone"] == PHONE
    assert row["attributes"] == body["attributes"]
    assert row["tags"] == ["lead", "vip"]

    assert client.get(f"/v1/contacts/{body['id']}").json() == body


def test_create_with_only_a_phone_uses_the_defaults(client: TestClient[Any]) -> None:
    body = create(client)
    assert body["name"] is None
    assert body["timezone"] is None
    assert body["attributes"] == {}
    assert body["tags"] == []


def test_a_taken_phone_is_409_and_leaves_the_original_untouched(
    client: TestClient[Any], pool: ConnectionPool, project: Project
) -> None:
    original = create(client, name="Original", attributes={"a": 1}, tags=["keep"])
    before = stored(pool, original["id"])

    response = client.post(
        "/v1/contacts",
        json={"phone": "+1 415 555 0123", "name": "Intruder", "attributes": {"a": 2}, "tags": ["new"]},
    )
    assert_problem(response, 409, "phone")

    assert stored(pool, original["id"]) == before
    assert stored_count(pool, project) == 1
    # the connection the failed insert used is healthy again
    assert client.get(f"/v1/contacts/{original['id']}").json()["name"] == "Original"


def test_the_same_phone_may_exist_in_another_project(client: TestClient[Any], other_project: Project) -> None:
    mine = create(client)
    response = client.post("/v1/contacts", json={"phone": PHONE}, headers=other_project.headers)
    assert response.status_code == 201, response.text
    assert response.json()["id"] != mine["id"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"phone": PHONE, "nmae": "x"}, "nmae"),
        ({"phone": PHONE, "attributes": 5}, "attributes"),
        ({"phone": PHONE, "attributes": ["a"]}, "attributes"),
        ({"phone": PHONE, "tags": "vip"}, "tags"),
        ({"phone": PHONE, "tags": [1]}, "tags.0"),
        ({"phone": PHONE, "name": 5}, "name"),
        ({"phone": PHONE, "timezone": 1}, "timezone"),
        ({"phone": 14155550123}, "phone"),
        ({"name": "no phone"}, "phone"),
        ({"phone": PHONE, "id": str(uuid.uuid4())}, "id"),
        ({"phone": PHONE, "consent": "granted"}, "consent"),
    ],
)
def test_create_with_an_unknown_field_or_a_wrong_type_is_400_naming_it(
    client: TestClient[Any], pool: ConnectionPool, project: Project, body: dict[str, Any], field: str
) -> None:
    assert_problem(client.post("/v1/contacts", json=body), 400, field)
    assert stored_count(pool, project) == 0


@pytest.mark.parametrize(
    "phone",
    [
        "12345",
        "4155550123",
        "+0123456789",
        "+1415abc0123",
        "",
        "+12345",
        "+1234567890123456",
        "+1 415\x00555",
    ],
)
def test_create_with_an_invalid_phone_is_422_naming_phone(
    client: TestClient[Any], pool: ConnectionPool, project: Project, phone: str
) -> None:
    assert_problem(client.post("/v1/contacts", json={"phone": phone}), 422, "phone")
    assert stored_count(pool, project) == 0


@pytest.mark.parametrize(
    "timezone",
    ["", "Mars/Olympus", "Europe", "Europe/", "europe/lisbon", "Europe/Lisbon ", "../etc/passwd", "+01:00"],
)
def test_create_with_an_invalid_timezone_is_422_naming_timezone(
    client: TestClient[Any], pool: ConnectionPool, project: Project, timezone: str
) -> None:
    response = client.post("/v1/contacts", json={"phone": PHONE, "timezone": timezone})
    assert_problem(response, 422, "timezone")
    assert stored_count(pool, project) == 0


@pytest.mark.parametrize(
    "timezone", ["UTC", "America/New_York", "Asia/Kolkata", "America/Argentina/Buenos_Aires"]
)
def test_iana_timezones_are_accepted(client: TestClient[Any], timezone: str) -> None:
    assert create(client, timezone=timezone)["timezone"] == timezone


@pytest.mark.parametrize(
    "tag", ["", "   ", "!vip", "-lead", "a" * 65, "with,comma", "new\nline", "a//b", "a/", "a/./b", "a/."]
)
def test_create_with_an_invalid_tag_is_422_naming_tags(
    client: TestClient[Any], pool: ConnectionPool, project: Project, tag: str
) -> None:
    response = client.post("/v1/contacts", json={"phone": PHONE, "tags": ["ok", tag]})
    assert_problem(response, 422, "tags")
    assert stored_count(pool, project) == 0


def test_too_many_tags_or_attributes_is_422(
    client: TestClient[Any], pool: ConnectionPool, project: Project
) -> None:
    tags = [f"t{i}" for i in range(101)]
    assert_problem(client.post("/v1/contacts", json={"phone": PHONE, "tags": tags}), 422, "tags")
    attributes = {f"k{i}": i for i in range(101)}
    response = client.post("/v1/contacts", json={"phone": PHONE, "attributes": attributes})
    assert_problem(response, 422, "attributes")
    response = client.post("/v1/contacts", json={"phone": PHONE, "attributes": {"": 1}})
    assert_problem(response, 422)
    response = client.post("/v1/contacts", json={"phone": PHONE, "attributes": {"k" * 65: 1}})
    assert_problem(response, 422)
    assert stored_count(pool, project) == 0
    # exactly at the limits is fine
    body = create(client, tags=tags[:100], attributes=dict(list(attributes.items())[:100]))
    assert len(body["tags"]) == 100 and len(body["attributes"]) == 100


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"phone": PHONE, "name": "Ada\x00"}, "name"),
        ({"phone": PHONE, "attributes": {"note": "a\x00b"}}, "attributes"),
        ({"phone": PHONE, "attributes": {"nested": {"deep": ["x\x00"]}}}, "attributes"),
        ({"phone": PHONE, "attributes": {"k\x00": 1}}, "attributes"),
        ({"phone": PHONE, "timezone": "Europe/Lisbon\x00"}, "timezone"),
    ],
)
def test_text_the_database_cannot_store_is_422_not_500(
    client: TestClient[Any], pool: ConnectionPool, project: Project, body: dict[str, Any], field: str
) -> None:
    response = client.post("/v1/contacts", json=body)
    problem = assert_problem(response, 422)
    assert any(error["field"].split(".")[0] == field for error in problem["errors"]), problem
    assert stored_count(pool, project) == 0


@pytest.mark.parametrize("content", [b"{not json", b"[]", b'"a string"', b"", b'{"phone": "+14155550123",}'])
def test_a_body_that_is_not_a_json_object_is_400(
    client: TestClient[Any], pool: ConnectionPool, project: Project, content: bytes
) -> None:
    response = client.post("/v1/contacts", content=content, headers={"content-type": "application/json"})
    assert_problem(response, 400)
    assert stored_count(pool, project) == 0


def test_a_deeply_nested_body_is_a_problem_not_a_500(
    client: TestClient[Any], pool: ConnectionPool, project: Project
) -> None:
    created = 0
    for n, depth in enumerate([*range(850, 1100, 10), 5000, 100_000]):
        nested = b"[" * depth + b"]" * depth
        raw = b'{"phone": "+1415555%04d", "attributes": {"a": %s}}' % (n, nested)
        response = client.post("/v1/contacts", content=raw, headers={"content-type": "application/json"})
        if response.status_code == 201:
            created += 1
        else:
            assert_problem(response, 400, "body")
    assert stored_count(pool, project) == created
    assert created < 27  # the two deepest at least are refused


# --- upsert by phone


def test_upsert_creates_then_merges(client: TestClient[Any], pool: ConnectionPool, project: Project) -> None:
    first = client.put(
        by_phone("+1 415-555-0123"),
        json={"name": "Ada", "timezone": "UTC", "attributes": {"a": 1, "b": 2}, "tags": ["lead"]},
    )
    assert first.status_code == 201, first.text
    created = first.json()
    assert created["phone"] == PHONE
    assert created["attributes"] == {"a": 1, "b": 2}

    second = client.put(
        by_phone(PHONE), json={"timezone": "Europe/Lisbon", "attributes": {"b": 3, "c": 4}, "tags": ["vip"]}
    )
    assert second.status_code == 200, second.text
    updated = second.json()
    assert updated["id"] == created["id"]
    assert updated["name"] == "Ada"  # absent: kept
    assert updated["timezone"] == "Europe/Lisbon"
    assert updated["attributes"] == {"a": 1, "b": 3, "c": 4}
    assert updated["tags"] == ["lead", "vip"]

    # an empty body changes nothing and still answers 200
    third = client.put(by_phone(PHONE), json={})
    assert third.status_code == 200
    assert {k: v for k, v in third.json().items() if k != "updated_at"} == {
        k: v for k, v in updated.items() if k != "updated_at"
    }
    assert stored_count(pool, project) == 1
    row = stored(pool, created["id"])
    assert row is not None and row["attributes"] == {"a": 1, "b": 3, "c": 4}


def test_upsert_finds_a_contact_created_with_another_formatting(client: TestClient[Any]) -> None:
    created = create(client, name="Ada")
    response = client.put(by_phone("+1 (415) 555-0123"), json={"tags": ["x"]})
    assert response.status_code == 200, response.text
    assert response.json()["id"] == created["id"]
    assert response.json()["tags"] == ["x"]


def test_upsert_body_may_not_carry_the_phone(
    client: TestClient[Any], pool: ConnectionPool, project: Project
) -> None:
    response = client.put(by_phone(PHONE), json={"phone": "+14155550199"})
    assert_problem(response, 400, "phone")
    assert stored_count(pool, project) == 0


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"nmae": "x"}, 400, "nmae"),
        ({"attributes": 5}, 400, "attributes"),
        ({"tags": "vip"}, 400, "tags"),
        ({"timezone": "Nowhere/Town"}, 422, "timezone"),
        ({"tags": ["!bad"]}, 422, "tags"),
    ],
)
def test_a_bad_upsert_leaves_the_existing_contact_untouched(
    client: TestClient[Any], pool: ConnectionPool, body: dict[str, Any], status: int, field: str
) -> None:
    original = create(client, name="Ada", timezone="UTC", attributes={"a": 1}, tags=["t"])
    before = stored(pool, original["id"])
    assert_problem(client.put(by_phone(PHONE), json=body), status, field)
    assert stored(pool, original["id"]) == before


@pytest.mark.parametrize("phone", ["not-a-phone", "12345", "+0999", "+1415555012345678"])
def test_upsert_with_an_invalid_phone_is_422(
    client: TestClient[Any], pool: ConnectionPool, project: Project, phone: str
) -> None:
    assert_problem(client.put(by_phone(phone), json={"name": "x"}), 422, "phone")
    assert stored_count(pool, project) == 0


def test_upsert_never_touches_another_projects_contact(
    client: TestClient[Any], pool: ConnectionPool, other_project: Project
) -> None:
    theirs = client.post(
        "/v1/contacts",
        json={"phone": PHONE, "name": "Theirs", "tags": ["secret"]},
        headers=other_project.headers,
    ).json()
    before = stored(pool, theirs["id"])

    response = client.put(by_phone(PHONE), json={"name": "Mine", "attributes": {"x": 1}})
    assert response.status_code == 201, response.text
    mine = response.json()
    assert mine["id"] != theirs["id"]
    assert mine["tags"] == [] and mine["name"] == "Mine"
    assert stored(pool, theirs["id"]) == before


# --- read


def test_another_projects_contact_is_404_and_not_leaked(
    client: TestClient[Any], pool: ConnectionPool, other_project: Project
) -> None:
    theirs = client.post(
        "/v1/contacts",
        json={"phone": "+447700900123", "name": "Secret Name", "attributes": {"ssn": "123-45"}},
        headers=other_project.headers,
    ).json()
    assert client.get(f"/v1/contacts/{theirs['id']}", headers=other_project.headers).status_code == 200

    response = client.get(f"/v1/contacts/{theirs['id']}")
    assert_problem(response, 404)
    assert (
        "Secret" not in response.text
        and "447700900123" not in response.text
        and "123-45" not in response.text
    )


def test_an_unknown_contact_is_404(client: TestClient[Any]) -> None:
    assert_problem(client.get(f"/v1/contacts/{uuid.uuid4()}"), 404)


@pytest.mark.parametrize("contact_id", ["not-a-uuid", "123", "00000000-0000-0000-0000-00000000000g"])
def test_a_non_uuid_id_is_a_client_error_problem(client: TestClient[Any], contact_id: str) -> None:
    for response in (
        client.get(f"/v1/contacts/{contact_id}"),
        client.patch(f"/v1/contacts/{contact_id}", json={"name": "x"}),
        client.post(f"/v1/contacts/{contact_id}/tags", json={"tags": ["x"]}),
        client.delete(f"/v1/contacts/{contact_id}/tags/x"),
    ):
        assert response.status_code in (400, 404, 422), response.text
        assert_problem(response, response.status_code)


# --- update


def test_patch_changes_name_and_timezone_and_merges_attributes(
    client: TestClient[Any], pool: ConnectionPool
) -> None:
    contact = create(
        client, name="Ada", timezone="UTC", attributes={"a": 1, "b": 2, "c": {"x": 1}}, tags=["keep"]
    )
    response = client.patch(
        f"/v1/contacts/{contact['id']}",
        json={"name": "Ada L.", "timezone": "Asia/Tokyo", "attributes": {"a": 5, "b": None, "d": "new"}},
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["name"] == "Ada L."
    assert body["timezone"] == "Asia/Tokyo"
    assert body["attributes"] == {"a": 5, "c": {"x": 1}, "d": "new"}
    assert body["tags"] == ["keep"]
    assert body["phone"] == PHONE
    assert body["updated_at"] >= contact["updated_at"]

    row = stored(pool, contact["id"])
    assert row is not None
    assert row["attributes"] == {"a": 5, "c": {"x": 1}, "d": "new"}
    assert row["name"] == "Ada L." and row["timezone"] == "Asia/Tokyo"


def test_patch_keeps_absent_fields_and_clears_nulls(client: TestClient[Any]) -> None:
    contact = create(client, name="Ada", timezone="UTC", attributes={"a": 1})
    kept = client.patch(f"/v1/contacts/{contact['id']}", json={}).json()
    assert (kept["name"], kept["timezone"], kept["attributes"]) == ("Ada", "UTC", {"a": 1})

    only_name = client.patch(f"/v1/contacts/{contact['id']}", json={"name": "Bo"}).json()
    assert (only_name["name"], only_name["timezone"], only_name["attributes"]) == ("Bo", "UTC", {"a": 1})

    cleared = client.patch(f"/v1/contacts/{contact['id']}", json={"name": None, "timezone": None}).json()
    assert (cleared["name"], cleared["timezone"], cleared["attributes"]) == (None, None, {"a": 1})

    # removing an attribute that is not there is a no-op
    removed = client.patch(
        f"/v1/contacts/{contact['id']}", json={"attributes": {"a": None, "zz": None}}
    ).json()
    assert removed["attributes"] == {}


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"nmae": "x"}, 400, "nmae"),
        ({"phone": "+14155550199"}, 400, "phone"),
        ({"tags": ["x"]}, 400, "tags"),
        ({"attributes": 5}, 400, "attributes"),
        ({"attributes": None}, 400, "attributes"),
        ({"name": ["x"]}, 400, "name"),
        ({"timezone": "Moon/Base"}, 422, "timezone"),
        ({"timezone": "Europe"}, 422, "timezone"),
        ({"timezone": ""}, 422, "timezone"),
        ({"name": "ok", "timezone": "Bad/Zone"}, 422, "timezone"),
        ({"name": "a\x00b"}, 422, "name"),
    ],
)
def test_a_bad_patch_is_rejected_and_changes_nothing(
    client: TestClient[Any], pool: ConnectionPool, body: dict[str, Any], status: int, field: str
) -> None:
    contact = create(client, name="Ada", timezone="UTC", attributes={"a": 1})
    before = stored(pool, contact["id"])
    assert_problem(client.patch(f"/v1/contacts/{contact['id']}", json=body), status, field)
    assert stored(pool, contact["id"]) == before


def test_patching_another_projects_contact_is_404_and_changes_nothing(
    client: TestClient[Any], pool: ConnectionPool, other_project: Project
) -> None:
    theirs = client.post(
        "/v1/contacts",
        json={"phone": PHONE, "name": "Theirs", "attributes": {"a": 1}},
        headers=other_project.headers,
    ).json()
    before = stored(pool, theirs["id"])
    response = client.patch(
        f"/v1/contacts/{theirs['id']}", json={"name": "Hijacked", "attributes": {"a": None}}
    )
    assert_problem(response, 404)
    assert "Theirs" not in response.text
    assert stored(pool, theirs["id"]) == before


def test_patching_an_unknown_contact_is_404(client: TestClient[Any]) -> None:
    assert_problem(client.patch(f"/v1/contacts/{uuid.uuid4()}", json={"name": "x"}), 404)


# --- tags


def test_adding_tags_is_idempotent_and_normalised(client: TestClient[Any], pool: ConnectionPool) -> None:
    contact = create(client, tags=["b"])
    url = f"/v1/contacts/{contact['id']}/tags"
    first = client.post(url, json={"tags": ["c", " a ", "a", "team/sales"]})
    assert first.status_code == 200, first.text
    assert first.json()["tags"] == ["a", "b", "c", "team/sales"]
    second = client.post(url, json={"tags": ["a", "c"]})
    assert second.status_code == 200
    assert second.json()["tags"] == ["a", "b", "c", "team/sales"]
    assert client.post(url, json={"tags": []}).json()["tags"] == ["a", "b", "c", "team/sales"]
    row = stored(pool, contact["id"])
    assert row is not None and row["tags"] == ["a", "b", "c", "team/sales"]


def test_removing_a_tag_is_idempotent(client: TestClient[Any], pool: ConnectionPool) -> None:
    contact = create(client, tags=["a", "b", "c"])
    url = f"/v1/contacts/{contact['id']}/tags"
    first = client.delete(f"{url}/b")
    assert first.status_code == 200, first.text
    assert first.json()["tags"] == ["a", "c"]
    again = client.delete(f"{url}/b")
    assert again.status_code == 200
    assert again.json()["tags"] == ["a", "c"]
    assert client.delete(f"{url}/never-there").json()["tags"] == ["a", "c"]
    row = stored(pool, contact["id"])
    assert row is not None and row["tags"] == ["a", "c"]


def test_any_tag_that_can_be_added_can_be_removed(client: TestClient[Any]) -> None:
    contact = create(client, tags=["stage:won", "big deal", "team/sales", "a/b/c", "x/../y", "keep"])
    url = f"/v1/contacts/{contact['id']}/tags"
    remaining = {"stage:won", "big deal", "team/sales", "a/b/c", "x/../y", "keep"}
    for tag in ["stage:won", "big deal", "team/sales", "a/b/c", "x/../y"]:
        response = client.delete(f"{url}/{quote(tag, safe='')}")
        assert response.status_code == 200, (tag, response.text)
        remaining.discard(tag)
        assert response.json()["tags"] == sorted(remaining)


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"tags": ["ok", "!bad"]}, 422, "tags"),
        ({"tags": [""]}, 422, "tags"),
        ({"tags": ["x" * 65]}, 422, "tags"),
        ({"tags": "vip"}, 400, "tags"),
        ({"tags": [5]}, 400, "tags.0"),
        ({}, 400, "tags"),
        ({"tags": ["a"], "extra": 1}, 400, "extra"),
        ({"tags": [f"t{i}" for i in range(101)]}, 422, "tags"),
    ],
)
def test_bad_tags_are_rejected_and_change_nothing(
    client: TestClient[Any], pool: ConnectionPool, body: dict[str, Any], status: int, field: str
) -> None:
    contact = create(client, tags=["keep"])
    before = stored(pool, contact["id"])
    assert_problem(client.post(f"/v1/contacts/{contact['id']}/tags", json=body), status, field)
    assert stored(pool, contact["id"]) == before


def test_removing_an_invalid_tag_is_a_problem_not_a_500(
    client: TestClient[Any], pool: ConnectionPool
) -> None:
    contact = create(client, tags=["keep"])
    before = stored(pool, contact["id"])
    bad = quote("bad\x00tag")
    response = client.delete(f"/v1/contacts/{contact['id']}/tags/{bad}")
    assert_problem(response, 422, "tag")
    assert stored(pool, contact["id"]) == before


def test_tags_of_another_projects_contact_are_404_and_untouched(
    client: TestClient[Any], pool: ConnectionPool, other_project: Project
) -> None:
    theirs = client.post(
        "/v1/contacts", json={"phone": PHONE, "tags": ["secret", "vip"]}, headers=other_project.headers
    ).json()
    before = stored(pool, theirs["id"])
    added = client.post(f"/v1/contacts/{theirs['id']}/tags", json={"tags": ["pwned"]})
    assert_problem(added, 404)
    removed = client.delete(f"/v1/contacts/{theirs['id']}/tags/vip")
    assert_problem(removed, 404)
    assert "secret" not in added.text and "secret" not in removed.text
    assert stored(pool, theirs["id"]) == before


def test_tags_of_an_unknown_contact_are_404(client: TestClient[Any]) -> None:
    assert_problem(client.post(f"/v1/contacts/{uuid.uuid4()}/tags", json={"tags": ["a"]}), 404)
    assert_problem(client.delete(f"/v1/contacts/{uuid.uuid4()}/tags/a"), 404)


# --- list


def _phones(n: int) -> list[str]:
    return [f"+1415555{i:04d}" for i in range(n)]


def test_list_paginates_across_pages_without_gaps_or_repeats(client: TestClient[Any]) -> None:
    ids = {create_with_phone(client, phone)["id"] for phone in _phones(5)}
    seen: list[str] = []
    after: str | None = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 2}
        if after is not None:
            params["after"] = after
        response = client.get("/v1/contacts", params=params)
        assert response.status_code == 200, response.text
        page = response.json()
        assert len(page["items"]) <= 2
        seen.extend(item["id"] for item in page["items"])
        pages += 1
        after = page["next"]
        if after is None:
            break
        assert pages < 10
    assert pages == 3
    assert len(seen) == len(set(seen)) == 5
    assert set(seen) == ids
    assert seen == sorted(seen, key=uuid.UUID)


def test_the_last_full_page_has_no_next_cursor(client: TestClient[Any]) -> None:
    for phone in _phones(4):
        create_with_phone(client, phone)
    first = client.get("/v1/contacts", params={"limit": 2}).json()
    assert len(first["items"]) == 2 and first["next"] is not None
    second = client.get("/v1/contacts", params={"limit": 2, "after": first["next"]}).json()
    assert len(second["items"]) == 2
    assert second["next"] is None
    everything = client.get("/v1/contacts", params={"limit": 4}).json()
    assert len(everything["items"]) == 4 and everything["next"] is None


def test_list_defaults_and_empty(client: TestClient[Any]) -> None:
    assert client.get("/v1/contacts").json() == {"items": [], "next": None}
    create(client)
    page = client.get("/v1/contacts").json()
    assert [item["phone"] for item in page["items"]] == [PHONE]
    assert page["next"] is None


def test_list_filters_by_tag_and_by_phone(client: TestClient[Any]) -> None:
    a = create_with_phone(client, "+14155550001", tags=["vip", "lead"])
    b = create_with_phone(client, "+14155550002", tags=["vip"])
    create_with_phone(client, "+14155550003", tags=["lead"])

    vip = client.get("/v1/contacts", params={"tag": "vip"}).json()
    assert {item["id"] for item in vip["items"]} == {a["id"], b["id"]}
    assert client.get("/v1/contacts", params={"tag": "none"}).json()["items"] == []

    by_number = client.get("/v1/contacts", params={"phone": "+1 415-555-0002"}).json()
    assert [item["id"] for item in by_number["items"]] == [b["id"]]

    both = client.get("/v1/contacts", params={"phone": "+14155550001", "tag": "lead"}).json()
    assert [item["id"] for item in both["items"]] == [a["id"]]
    assert client.get("/v1/contacts", params={"phone": "+14155550002", "tag": "lead"}).json()["items"] == []

    tagged = client.get("/v1/contacts", params={"tag": "vip", "limit": 1}).json()
    rest = client.get("/v1/contacts", params={"tag": "vip", "limit": 1, "after": tagged["next"]}).json()
    assert {tagged["items"][0]["id"], rest["items"][0]["id"]} == {a["id"], b["id"]}
    assert rest["next"] is None


def test_a_phone_filter_takes_a_literal_plus(client: TestClient[Any]) -> None:
    """A ``+`` left unencoded in a query string reads as a space (form encoding): the filter takes it as the
    ``+`` it was, as it takes ``%2B``."""
    contact = create_with_phone(client, "+14155550123")
    for query in ("phone=+14155550123", "phone=%2B14155550123", "phone=+1%20415-555-0123"):
        found = client.get(f"/v1/contacts?{query}")
        assert found.status_code == 200, (query, found.text)
        assert [item["id"] for item in found.json()["items"]] == [contact["id"]], query
    assert_problem(client.get("/v1/contacts?phone=14155550123"), 422, "phone")


def test_list_shows_only_the_callers_contacts(client: TestClient[Any], other_project: Project) -> None:
    mine = create(client)
    client.post(
        "/v1/contacts", json={"phone": "+14155550999", "tags": ["vip"]}, headers=other_project.headers
    )
    client.post("/v1/contacts", json={"phone": PHONE, "tags": ["vip"]}, headers=other_project.headers)
    assert [item["id"] for item in client.get("/v1/contacts").json()["items"]] == [mine["id"]]
    assert client.get("/v1/contacts", params={"tag": "vip"}).json()["items"] == []
    assert client.get("/v1/contacts", params={"phone": "+14155550999"}).json()["items"] == []


@pytest.mark.parametrize(
    ("params", "status", "field"),
    [
        ({"limit": 0}, 422, "limit"),
        ({"limit": 501}, 422, "limit"),
        ({"limit": "ten"}, 400, "limit"),
        ({"after": "not-a-uuid"}, 400, "after"),
        ({"phone": "12345"}, 422, "phone"),
        ({"tag": "bad\x00tag"}, 422, "tag"),
    ],
)
def test_bad_list_parameters_are_problems_naming_them(
    client: TestClient[Any], params: dict[str, Any], status: int, field: str
) -> None:
    assert_problem(client.get("/v1/contacts", params=params), status, field)


# --- erased contacts


def erase(client: TestClient[Any], contact_id: str) -> None:
    response = client.post("/v1/events", json={"type": "contact.erased", "contact_id": contact_id})
    assert response.status_code == 200, response.text


def test_an_erased_contact_is_404_on_every_path_and_stays_anonymised(
    client: TestClient[Any], pool: ConnectionPool
) -> None:
    # Given an erased contact
    contact = create(client, name="Grace", attributes={"email": "grace@example.com"}, tags=["vip"])
    erase(client, contact["id"])
    before = stored(pool, contact["id"])
    assert before is not None and before["erased_at"] is not None

    # When it is read or changed, Then it is 404 like a contact that never existed, with nothing of it
    for response in (
        client.get(f"/v1/contacts/{contact['id']}"),
        client.patch(f"/v1/contacts/{contact['id']}", json={"name": "Grace again"}),
        client.post(f"/v1/contacts/{contact['id']}/tags", json={"tags": ["vip"]}),
        client.delete(f"/v1/contacts/{contact['id']}/tags/vip"),
    ):
        body = assert_problem(response, 404)
        assert body["detail"] == "contact not found"
    # and nothing was written to it
    assert stored(pool, contact["id"]) == before


def test_an_erased_contact_is_left_out_of_every_list(client: TestClient[Any]) -> None:
    first, erased, last = (create_with_phone(client, phone, tags=["vip"]) for phone in _phones(3))
    erase(client, erased["id"])

    everything = client.get("/v1/contacts").json()
    assert [item["id"] for item in everything["items"]] == sorted([first["id"], last["id"]], key=uuid.UUID)
    assert {item["id"] for item in client.get("/v1/contacts", params={"tag": "vip"}).json()["items"]} == {
        first["id"],
        last["id"],
    }
    assert client.get("/v1/contacts", params={"phone": erased["phone"]}).json()["items"] == []
    # pages skip it without a gap: one contact per page, two pages
    seen, after = [], None
    while True:
        params: dict[str, Any] = {"limit": 1} | ({"after": after} if after else {})
        page = client.get("/v1/contacts", params=params).json()
        seen += [item["id"] for item in page["items"]]
        after = page["next"]
        if after is None:
            break
    assert sorted(seen) == sorted([first["id"], last["id"]])


def test_the_phone_of_an_erased_contact_makes_a_new_contact(client: TestClient[Any]) -> None:
    erased = create(client, name="Grace")
    erase(client, erased["id"])

    response = client.put(by_phone(PHONE), json={"name": "Someone new"})

    assert response.status_code == 201, response.text
    assert response.json()["id"] != erased["id"]
    assert [item["name"] for item in client.get("/v1/contacts").json()["items"]] == ["Someone new"]
    assert_problem(client.get(f"/v1/contacts/{erased['id']}"), 404)


# --- authentication


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "",
        "Bearer",
        "Bearer ",
        "Basic dXNlcjpwYXNz",
        "Token {key}",
        "{key}",
        "Bearer fu_not-a-real-key",
        "Bearer nope",
    ],
)
def test_a_missing_or_wrong_api_key_is_401(
    client: TestClient[Any], pool: ConnectionPool, project: Project, authorization: str | None
) -> None:
    headers = {} if authorization is None else {"Authorization": authorization.format(key=project.api_key)}
    client.headers.pop("Authorization", None)
    for response in (
        client.get("/v1/contacts", headers=headers),
        client.get(f"/v1/contacts/{uuid.uuid4()}", headers=headers),
        client.post("/v1/contacts", json={"phone": PHONE}, headers=headers),
        client.post("/v1/contacts", json={"phone": PHONE, "nmae": 1}, headers=headers),
        client.put(by_phone(PHONE), json={}, headers=headers),
    ):
        assert_problem(response, 401)
        assert response.headers["www-authenticate"].lower().startswith("bearer")
    assert stored_count(pool, project) == 0


def test_a_revoked_key_is_401(client: TestClient[Any], pool: ConnectionPool, project: Project) -> None:
    assert client.get("/v1/contacts").status_code == 200
    with pool.connection() as conn:
        conn.execute("UPDATE api_keys SET revoked_at = now() WHERE project_id = %s", (project.id,))
    assert_problem(client.get("/v1/contacts"), 401)


def test_the_scheme_is_case_insensitive(client: TestClient[Any], project: Project) -> None:
    response = client.get("/v1/contacts", headers={"Authorization": f"bearer {project.api_key}"})
    assert response.status_code == 200, response.text


def create_with_phone(client: TestClient[Any], phone: str, **body: Any) -> dict[str, Any]:
    response = client.post("/v1/contacts", json={"phone": phone, **body})
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created


def test_a_project_id_parameter_cannot_select_another_project(
    client: TestClient[Any], other_project: Project
) -> None:
    client.post("/v1/contacts", json={"phone": PHONE, "name": "Theirs"}, headers=other_project.headers)
    response = client.get("/v1/contacts", params={"project_id": str(other_project.id)})
    assert response.status_code == 200, response.text
    assert response.json()["items"] == []
    response = client.post("/v1/contacts", json={"phone": PHONE, "project_id": str(other_project.id)})
    assert_problem(response, 400, "project_id")
