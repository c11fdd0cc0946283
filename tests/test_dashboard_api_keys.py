"""The dashboard's API keys page over HTTP: the list (never a key), a new key shown once, errors next to
their field, revoking (not the last admin key; the revoked key's sessions end), admin sessions only."""

from __future__ import annotations

import html
import re
from typing import Any

from litestar.testing import TestClient

from tests.conftest import Project, csrf_of
from tests.dashboard_helpers import api, errors_on, field_error
from tests.helpers import rows


def shown_key(page: str) -> str:
    found = re.search(r'id="new-key"[^>]*value="(fu_[^"]+)"', page)
    assert found, "no new key on the page"
    return html.unescape(found.group(1))


def create_via_form(client: TestClient[Any], token: str, **fields: str) -> Any:
    return client.post("/app/api-keys/new", data={"_csrf": token, **fields}, follow_redirects=False)


def test_a_new_key_is_shown_once_and_works_with_its_scope(signed_in, project, pool) -> None:
    client, token = signed_in
    listed = client.get("/app/api-keys")
    assert listed.status_code == 200 and "default" in listed.text and "admin" in listed.text
    created = create_via_form(
        client, token, name="CRM <b>sync</b>", scope="read", expires_at="2031-01-01T00:00"
    )
    assert created.status_code == 201, errors_on(created.text)
    assert created.headers["cache-control"] == "no-store"
    key = shown_key(created.text)
    assert "CRM &lt;b&gt;sync&lt;/b&gt;" in created.text and "<b>sync" not in created.text
    # the key is a read key of the project, expiring when the form said (UTC)
    [(scope, expires_at)] = rows(pool, "SELECT scope, expires_at FROM api_keys WHERE prefix = %s", key[:8])
    assert scope == "read" and expires_at.isoformat() == "2031-01-01T00:00:00+00:00"
    headers = {"Authorization": f"Bearer {key}"}
    assert client.get("/v1/contacts", headers=headers).status_code == 200
    assert client.post("/v1/contacts", json={"phone": "+14155550100"}, headers=headers).status_code == 403
    # shown once: the list shows its prefix, never the key
    again = client.get("/app/api-keys")
    assert key not in again.text and key[:8] in again.text


def test_a_key_the_form_cannot_create_is_shown_next_to_its_field(signed_in) -> None:
    client, token = signed_in
    cases = [
        ({"name": "", "scope": "read"}, "name"),
        ({"name": "x" * 201, "scope": "read"}, "name"),
        ({"name": "k", "scope": "owner"}, "scope"),
        ({"name": "k", "scope": "read", "expires_at": "tomorrow"}, "expires_at"),
        ({"name": "k", "scope": "read", "expires_at": "2001-01-01T00:00"}, "expires_at"),
    ]
    for fields, name in cases:
        response = create_via_form(client, token, **fields)
        assert response.status_code == 422, (fields, response.status_code)
        assert field_error(response.text, name), fields
        assert 'id="new-key"' not in response.text


def test_revoking_a_key_ends_its_use_but_not_the_last_admin_key(signed_in, project, pool) -> None:
    client, token = signed_in
    write = api(client, project, "POST", "/v1/api-keys", json={"name": "app", "scope": "write"})
    revoked = client.post(
        f"/app/api-keys/{write['key']['id']}/revoke", data={"_csrf": token}, follow_redirects=False
    )
    assert revoked.status_code == 303 and revoked.headers["location"] == "/app/api-keys?notice=revoked"
    assert "revoked" in client.get(revoked.headers["location"]).text
    assert (
        client.get("/v1/contacts", headers={"Authorization": f"Bearer {write['api_key']}"}).status_code == 401
    )
    [(first,)] = rows(pool, "SELECT id FROM api_keys WHERE project_id = %s AND scope = 'admin'", project.id)
    refused = client.post(f"/app/api-keys/{first}/revoke", data={"_csrf": token}, follow_redirects=False)
    assert refused.status_code == 409
    assert "last live admin key" in refused.text
    assert rows(pool, "SELECT revoked_at FROM api_keys WHERE id = %s", first) == [(None,)]
    # without the form's token nothing is revoked
    other = api(client, project, "POST", "/v1/api-keys", json={"name": "other", "scope": "read"})
    forged = client.post(f"/app/api-keys/{other['key']['id']}/revoke", data={}, follow_redirects=False)
    assert forged.status_code == 403
    assert rows(pool, "SELECT revoked_at FROM api_keys WHERE id = %s", other["key"]["id"]) == [(None,)]


def test_revoking_the_sessions_own_key_signs_it_out(app_client, project) -> None:
    second = api(app_client, project, "POST", "/v1/api-keys", json={"name": "laptop", "scope": "admin"})
    form = app_client.get("/app/sign-in")
    app_client.post("/app/sign-in", data={"_csrf": csrf_of(form.text), "api_key": second["api_key"]})
    token = csrf_of(app_client.get("/app/api-keys").text)
    response = app_client.post(
        f"/app/api-keys/{second['key']['id']}/revoke", data={"_csrf": token}, follow_redirects=False
    )
    assert response.status_code == 303
    after = app_client.get(response.headers["location"], follow_redirects=False)
    assert after.status_code == 303 and after.headers["location"].startswith("/app/sign-in")


def test_only_an_admin_session_sees_the_keys(app_client, project: Project) -> None:
    write = api(app_client, project, "POST", "/v1/api-keys", json={"name": "app", "scope": "write"})
    form = app_client.get("/app/sign-in")
    app_client.post("/app/sign-in", data={"_csrf": csrf_of(form.text), "api_key": write["api_key"]})
    page = app_client.get("/app/sequences")
    assert page.status_code == 200 and 'href="/app/api-keys"' not in page.text
    refused = app_client.get("/app/api-keys")
    assert refused.status_code == 403 and "`admin` scope" in refused.text
    token = csrf_of(page.text)
    assert create_via_form(app_client, token, name="sneaky", scope="admin").status_code == 403
    listed = api(app_client, project, "GET", "/v1/api-keys")
    assert "sneaky" not in {key["name"] for key in listed["items"]}
