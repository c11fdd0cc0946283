"""API keys through ``/v1/api-keys`` and ``followups api-key``: created with a name, a scope and an expiry
(shown once, stored hashed), listed with their last use (written at most once a minute), revoked (never
the project's last admin key); and scopes: every ``/v1`` route needs one, and a key gets only what its
scope grants (403 naming the missing scope)."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import threading
import uuid
from datetime import timedelta
from typing import Any

import pytest
from litestar import Controller, Litestar, get, post
from litestar.di import Provide
from litestar.testing import TestClient
from prometheus_client import REGISTRY
from psycopg_pool import ConnectionPool

from libs.common.core.clock import ManualClock
from libs.common.core.errors import Conflict
from libs.common.platform import api_keys
from services.api import scopes
from services.api.deps import ProjectId
from tests.conftest import Project
from tests.helpers import rows, wait_until


def iso(moment: Any) -> str:
    return str(moment.isoformat())


def new_key(client: TestClient[Any], scope: str, **fields: Any) -> dict[str, Any]:
    response = client.post("/v1/api-keys", json={"name": f"{scope} key", "scope": scope, **fields})
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


# --- keys: create, list, revoke -----------------------------------------------------------------------------


def test_a_key_is_shown_once_and_stored_only_as_its_hash(client, pool, clock) -> None:
    created = new_key(client, "read", expires_at=iso(clock.now() + timedelta(days=30)))
    key, listed = created["api_key"], created["key"]
    assert key.startswith("fu_") and listed["prefix"] == key[:8]
    assert listed["name"] == "read key" and listed["scope"] == "read"
    assert listed["created_at"] == iso(clock.now()).replace("+00:00", "Z")
    assert listed["last_used_at"] is None and listed["revoked_at"] is None
    # the list and the read show everything but the key
    page = client.get("/v1/api-keys").json()
    assert listed in page["items"] and len(page["items"]) == 2  # the project's first key, and this one
    assert key not in client.get("/v1/api-keys").text
    assert client.get(f"/v1/api-keys/{listed['id']}").json() == listed
    [(stored,)] = rows(pool, "SELECT key_hash FROM api_keys WHERE id = %s", listed["id"])
    assert bytes(stored) == hashlib.sha256(key.encode()).digest()
    # the project's first key is an admin key named default
    first = next(item for item in page["items"] if item["id"] != listed["id"])
    assert (first["name"], first["scope"]) == ("default", "admin")


def test_a_key_that_cannot_be_created_is_refused_naming_the_field(client, clock) -> None:
    cases = [
        ({"name": "k", "scope": "owner"}, 422, "scope"),
        ({"name": "", "scope": "read"}, 422, "name"),
        ({"name": "   ", "scope": "read"}, 422, "name"),
        ({"name": "k" * 201, "scope": "read"}, 422, "name"),
        ({"scope": "read"}, 400, "name"),
        ({"name": "k"}, 400, "scope"),
        (
            {"name": "k", "scope": "read", "expires_at": iso(clock.now() - timedelta(seconds=1))},
            422,
            "expires_at",
        ),
        ({"name": "k", "scope": "read", "expires_at": "2031-01-01T00:00:00"}, 422, "expires_at"),
        ({"name": "k", "scope": "read", "key_hash": "x"}, 400, "key_hash"),
    ]
    for body, status, field in cases:
        response = client.post("/v1/api-keys", json=body)
        assert response.status_code == status, (body, response.text)
        assert field in {error["field"] for error in response.json()["errors"]}, (body, response.json())


def test_a_revoked_key_authenticates_as_nothing_and_revoking_again_changes_nothing(client, clock) -> None:
    created = new_key(client, "write")
    key_id, headers = created["key"]["id"], bearer(created["api_key"])
    assert client.get("/v1/contacts", headers=headers).status_code == 200
    revoked = client.post(f"/v1/api-keys/{key_id}/revoke")
    assert revoked.status_code == 200, revoked.text
    assert revoked.json()["revoked_at"] == iso(clock.now()).replace("+00:00", "Z")
    before = refusals("unauthorized")
    response = client.get("/v1/contacts", headers=headers)
    assert response.status_code == 401 and response.headers["www-authenticate"].lower() == "bearer"
    assert refusals("unauthorized") - before == 1
    clock.advance(timedelta(hours=1))
    assert client.post(f"/v1/api-keys/{key_id}/revoke").json() == revoked.json()
    listed = {item["id"]: item for item in client.get("/v1/api-keys").json()["items"]}
    assert listed[key_id]["revoked_at"] == revoked.json()["revoked_at"]


def test_an_expired_key_authenticates_as_nothing(client, clock) -> None:
    created = new_key(client, "read", expires_at=iso(clock.now() + timedelta(hours=1)))
    headers = bearer(created["api_key"])
    assert client.get("/v1/contacts", headers=headers).status_code == 200
    clock.advance(timedelta(minutes=59, seconds=59))
    assert client.get("/v1/contacts", headers=headers).status_code == 200
    clock.advance(timedelta(seconds=1))
    assert client.get("/v1/contacts", headers=headers).status_code == 401


def test_the_last_live_admin_key_cannot_be_revoked(client, project, clock) -> None:
    [first] = [item for item in client.get("/v1/api-keys").json()["items"]]
    refused = client.post(f"/v1/api-keys/{first['id']}/revoke")
    assert refused.status_code == 409
    assert refused.json()["code"] == "last_admin_key"
    # an admin key that expires later counts while it lives; one that expired does not
    second = new_key(client, "admin", expires_at=iso(clock.now() + timedelta(hours=1)))
    write = new_key(client, "write")  # keys of other scopes never count
    assert write["key"]["scope"] == "write"
    clock.advance(timedelta(hours=2))
    assert client.post(f"/v1/api-keys/{first['id']}/revoke").json()["code"] == "last_admin_key"
    third = new_key(client, "admin")
    assert client.post(f"/v1/api-keys/{first['id']}/revoke").status_code == 200
    # the new admin key is now the last one: the project's old key is revoked and cannot revoke it
    assert client.post(f"/v1/api-keys/{third['key']['id']}/revoke").status_code == 401
    admin = bearer(third["api_key"])
    assert client.post(f"/v1/api-keys/{third['key']['id']}/revoke", headers=admin).status_code == 409
    assert client.post(f"/v1/api-keys/{second['key']['id']}/revoke", headers=admin).status_code == 200


def test_two_revocations_at_once_cannot_leave_a_project_without_an_admin_key(
    pool: ConnectionPool, project: Project, clock: ManualClock
) -> None:
    with pool.connection() as conn:
        data = api_keys.ApiKeyCreate(name="second admin", scope="admin")
        second = api_keys.create_key(conn, project.id, data, now=clock.now()).key
        [first] = [key for key in api_keys.list_keys(conn, project.id, limit=10) if key.id != second.id]
    outcomes: list[str] = []

    def revoke_second() -> None:
        try:
            with pool.connection() as conn:
                api_keys.revoke_key(conn, project.id, second.id, now=clock.now())
            outcomes.append("revoked")
        except Conflict as exc:
            outcomes.append(exc.code or "conflict")

    with pool.connection() as conn:
        api_keys.revoke_key(conn, project.id, first.id, now=clock.now())
        other = threading.Thread(target=revoke_second)
        other.start()
        wait_until(
            lambda: (
                rows(
                    pool,
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND wait_event_type = 'Lock'",
                )[0][0]
                == 1
            ),
            what="the second revocation waiting for the first",
        )
    other.join(30)
    assert outcomes == ["last_admin_key"]
    live = rows(
        pool, "SELECT count(*) FROM api_keys WHERE project_id = %s AND revoked_at IS NULL", project.id
    )
    assert live == [(1,)]


def test_last_used_is_written_at_most_once_a_minute(client, pool, clock) -> None:
    created = new_key(client, "read")
    key_id, headers = created["key"]["id"], bearer(created["api_key"])

    def last_used() -> Any:
        return rows(pool, "SELECT last_used_at, xmin::text FROM api_keys WHERE id = %s", key_id)[0]

    assert client.get("/v1/contacts", headers=headers).status_code == 200
    first, version = last_used()
    assert first == clock.now()
    clock.advance(timedelta(seconds=59))
    for _ in range(3):
        assert client.get("/v1/contacts", headers=headers).status_code == 200
    assert last_used() == (first, version)  # not written again: the same row version
    clock.advance(timedelta(seconds=1))
    assert client.get("/v1/contacts", headers=headers).status_code == 200
    assert last_used()[0] == clock.now()
    listed = client.get(f"/v1/api-keys/{key_id}").json()
    assert listed["last_used_at"] == iso(clock.now()).replace("+00:00", "Z")


def test_another_projects_keys_are_404(client, other_project) -> None:
    [theirs] = client.get("/v1/api-keys", headers=other_project.headers).json()["items"]
    assert client.get(f"/v1/api-keys/{theirs['id']}").status_code == 404
    assert client.post(f"/v1/api-keys/{theirs['id']}/revoke").status_code == 404
    assert client.get(f"/v1/api-keys/{uuid.uuid4()}").status_code == 404
    assert theirs["id"] not in client.get("/v1/api-keys").text


# --- scopes ------------------------------------------------------------------------------------------------


def refusals(reason: str) -> float:
    return REGISTRY.get_sample_value("followups_api_auth_refusals_total", {"reason": reason}) or 0.0


def test_each_scope_grants_what_it_says_and_a_403_names_the_missing_scope(client, project) -> None:
    before = refusals("missing_scope")
    refused = 0
    keys = {
        scope: bearer(new_key(client, scope)["api_key"]) for scope in ("admin", "write", "read", "events")
    }
    contact = {"phone": "+14155550100"}
    event = {"type": "message.inbound", "phone": "+14155550101", "provider_message_id": "in-1"}
    claim = {"limit": 1}
    requests = [
        ("GET", "/v1/contacts", None, {"admin", "write", "read"}),
        ("POST", "/v1/contacts", contact, {"admin", "write"}),
        ("PUT", "/v1/settings", {}, {"admin", "write"}),
        ("GET", "/v1/api-keys", None, {"admin"}),
        ("POST", "/v1/api-keys", {"name": "k", "scope": "read"}, {"admin"}),
        ("GET", "/v1/webhook-deliveries/secret", None, {"admin"}),
        ("POST", "/v1/webhook-deliveries/secret/rotate", {"overlap_seconds": 60}, {"admin"}),
        ("POST", "/v1/events", event, {"admin", "write", "events"}),
        ("POST", "/v1/send-lane/claim", claim, {"admin", "write", "events"}),
    ]
    for method, path, body, granted in requests:
        for scope, headers in keys.items():
            response = client.request(method, path, json=body, headers=headers)
            if scope in granted:
                assert response.status_code < 400 or response.status_code == 409, (method, path, scope)
                continue
            assert response.status_code == 403, (method, path, scope, response.text)
            refused += 1
            problem = response.json()
            needed = "admin" if granted == {"admin"} else ("read" if method == "GET" else "write")
            if path in ("/v1/events", "/v1/send-lane/claim"):
                needed = "events"
            assert problem["code"] == "missing_scope"
            assert f"it needs the `{needed}` scope" in problem["detail"]
            assert f"`{scope}`" in problem["detail"]
            assert problem["errors"] == [{"field": "scope", "message": problem["detail"]}]
    assert refusals("missing_scope") - before == refused


def test_every_v1_route_authenticates_and_needs_a_scope(api_app: Litestar) -> None:
    table = scopes.check_routes(api_app)
    v1 = {
        (method, route.path)
        for route in api_app.routes
        if route.path.startswith("/v1") and not route.path.startswith("/v1/providers/")
        for method in route.methods - {"OPTIONS"}
    }
    assert set(table) == v1 and len(v1) > 50  # the providers' webhooks authenticate by their signature
    for (method, path), needed in table.items():
        channel_change = path.endswith("/channel") and method != "GET"  # a number's credentials
        if path.startswith(("/v1/api-keys", "/v1/webhook-deliveries/secret")) or channel_change:
            assert needed == "admin", (method, path)
        elif path in ("/v1/events", "/v1/send-lane/claim"):
            assert needed == "events", (method, path)
        else:
            assert needed == ("read" if method == "GET" else "write"), (method, path)
    # the OpenAPI document names each operation's scope in its 403
    document = api_app.openapi_schema.to_schema()
    for (method, path), needed in table.items():
        operation = document["paths"][re.sub(r":\w+}", "}", path)]  # {id:uuid} is {id} in the document
        assert f"`{needed}`" in operation[method.lower()]["responses"]["403"]["description"], (method, path)


def test_an_app_with_a_v1_route_that_does_not_authenticate_or_needs_read_to_change_is_refused() -> None:
    class Open(Controller):
        path = "/v1/open"

        @get("/", sync_to_thread=False)
        def read(self) -> dict[str, str]:
            return {}

    class ReadOnlyWrite(Controller):
        path = "/v1/sneaky"
        opt = scopes.scope("read")

        @get("/", sync_to_thread=False)
        def read(self, project_id: ProjectId) -> dict[str, str]:
            return {}

        @post("/x", sync_to_thread=False)
        def change(self, project_id: ProjectId) -> dict[str, str]:
            return {}

    with pytest.raises(RuntimeError, match="does not authenticate"):
        scopes.check_routes(
            Litestar([Open], dependencies={"project_id": Provide(uuid.uuid4, sync_to_thread=False)})
        )
    with pytest.raises(RuntimeError, match="cannot need only the `read` scope"):
        scopes.check_routes(
            Litestar([ReadOnlyWrite], dependencies={"project_id": Provide(uuid.uuid4, sync_to_thread=False)})
        )


# --- the command line --------------------------------------------------------------------------------------


def run_cli(*args: str, db_url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "followups", "api-key", *args],
        env=os.environ | {"DATABASE_URL": db_url},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_cli_creates_lists_and_revokes_keys(db_url: str, project: Project, pool: ConnectionPool) -> None:
    project_arg = ("--project", str(project.id))
    created = run_cli("create", *project_arg, "--name", "send lane", "--scope", "events", db_url=db_url)
    assert created.returncode == 0, created.stderr
    lines = created.stdout.strip().splitlines()
    key = lines[0].removeprefix("api_key: ")
    key_id = lines[2].split("\t")[0]
    assert key.startswith("fu_") and lines[2].split("\t")[1:4] == ["send lane", key[:8], "events"]
    [(scope, stored)] = rows(pool, "SELECT scope, key_hash FROM api_keys WHERE id = %s", key_id)
    assert scope == "events" and bytes(stored) == hashlib.sha256(key.encode()).digest()

    listed = run_cli("list", *project_arg, db_url=db_url)
    assert listed.returncode == 0, listed.stderr
    assert key_id in listed.stdout and key not in listed.stdout
    assert len(listed.stdout.strip().splitlines()) == 3  # the header, the first key and the new one

    revoked = run_cli("revoke", *project_arg, key_id, db_url=db_url)
    assert revoked.returncode == 0, revoked.stderr
    [(revoked_at,)] = rows(pool, "SELECT revoked_at FROM api_keys WHERE id = %s", key_id)
    assert revoked_at is not None

    [(first_id,)] = rows(
        pool, "SELECT id FROM api_keys WHERE project_id = %s AND scope = 'admin'", project.id
    )
    last = run_cli("revoke", *project_arg, str(first_id), db_url=db_url)
    assert last.returncode == 2 and "last live admin key" in last.stderr and "Traceback" not in last.stderr
    for bad in (
        ("create", *project_arg, "--name", "x", "--scope", "read", "--expires-at", "tomorrow"),
        ("create", *project_arg, "--name", "x", "--scope", "read", "--expires-at", "2020-01-01T00:00:00Z"),
        ("create", *project_arg, "--name", "x" * 201, "--scope", "read"),
        ("revoke", *project_arg, "not-an-id"),
        ("revoke", *project_arg, str(uuid.uuid4())),
        ("list",),
    ):
        result = run_cli(*bad, db_url=db_url)
        assert result.returncode == 2, (bad, result.stdout)
        assert "Traceback" not in result.stderr and result.stderr.startswith("followups:"), result.stderr
