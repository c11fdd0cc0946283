"""A sequence's versions (issue 24, found 7): the list is paged and leaves the definitions out, one
version's read has it, and publishing a draft identical to the latest version returns that version (200,
no new row)."""

from __future__ import annotations

import uuid
from typing import Any

from litestar.testing import TestClient
from psycopg_pool import ConnectionPool

from tests.conftest import Project
from tests.test_api_sequences import assert_problem, message_step, new_sequence, publish, version_count


def _edit(client: TestClient[Any], sequence_id: str, text: str) -> None:
    response = client.patch(
        f"/v1/sequences/{sequence_id}", json={"definition": {"steps": [message_step(text)]}}
    )
    assert response.status_code == 200, response.text


def test_publishing_an_unchanged_draft_returns_the_latest_version_and_makes_no_new_one(
    client: TestClient[Any], pool: ConnectionPool, project: Project
) -> None:
    # Given a sequence published once
    sequence_id = new_sequence(client, message_step("same text"))
    first = publish(client, sequence_id)

    # When the unchanged draft is published again, twice
    again = [client.post(f"/v1/sequences/{sequence_id}/publish") for _ in range(2)]

    # Then each answer is 200 with version 1, and no row was added
    assert [r.status_code for r in again] == [200, 200]
    assert all(r.json() == first for r in again)
    assert version_count(pool, project) == 1

    # And a changed draft is a new version (201); changing it back is another one (it differs from v2)
    _edit(client, sequence_id, "other text")
    assert publish(client, sequence_id)["version"] == 2
    _edit(client, sequence_id, "same text")
    assert publish(client, sequence_id)["version"] == 3
    assert client.post(f"/v1/sequences/{sequence_id}/publish").json()["version"] == 3
    assert client.get(f"/v1/sequences/{sequence_id}").json()["current_version"] == 3


def test_the_versions_list_is_paged_without_definitions_and_one_version_has_its_definition(
    client: TestClient[Any], other_project: Project
) -> None:
    # Given five published versions
    sequence_id = new_sequence(client, message_step("text 1"))
    publish(client, sequence_id)
    for n in range(2, 6):
        _edit(client, sequence_id, f"text {n}")
        publish(client, sequence_id)

    # When the list is read two at a time
    seen: list[int] = []
    after: str | None = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 2} | ({"after": after} if after else {})
        response = client.get(f"/v1/sequences/{sequence_id}/versions", params=params)
        assert response.status_code == 200, response.text
        body = response.json()
        pages += 1
        for item in body["items"]:
            assert "definition" not in item
            assert set(item) == {"id", "sequence_id", "version", "step_count", "created_at"}
            assert item["step_count"] == 1
            seen.append(item["version"])
        after = body["next"]
        if after is None:
            break

    # Then every version is listed once, newest first, over three pages
    assert seen == [5, 4, 3, 2, 1] and pages == 3

    # And one version's read has its definition
    third = client.get(f"/v1/sequences/{sequence_id}/versions/3")
    assert third.status_code == 200, third.text
    assert third.json()["version"] == 3
    assert third.json()["definition"]["steps"][0]["text"] == "text 3"

    # And a version that does not exist, or another project's, is 404; a bad limit is 4xx naming it
    assert_problem(client.get(f"/v1/sequences/{sequence_id}/versions/9"), 404, "version")
    assert_problem(client.get(f"/v1/sequences/{uuid.uuid4()}/versions/1"), 404)
    theirs = client.post(
        "/v1/sequences",
        json={"name": "theirs", "definition": {"steps": [message_step("secret")]}},
        headers=other_project.headers,
    ).json()["id"]
    assert client.post(f"/v1/sequences/{theirs}/publish", headers=other_project.headers).status_code == 201
    for url in (f"/v1/sequences/{theirs}/versions", f"/v1/sequences/{theirs}/versions/1"):
        response = client.get(url)
        assert_problem(response, 404)
        assert "secret" not in response.text
    assert_problem(client.get(f"/v1/sequences/{sequence_id}/versions", params={"limit": 0}), 422, "limit")
