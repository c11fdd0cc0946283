"""Dashboard sessions kept on the server, over HTTP: the cookie is an opaque token (its hash stored), a
session ends at sign-out, at the revocation or expiry of its key and after DASHBOARD_SESSION_SECONDS
(expired rows go with the retention job); the sign-in form's nonce is always fresh (a planted cookie
signs nobody in); ``next`` is a local path (CR/LF is no 500); a session can do what its key's scope
grants."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from datetime import timedelta
from typing import Any

import msgspec
from litestar import Litestar
from litestar.testing import TestClient
from psycopg_pool import ConnectionPool

from libs.common.core.clock import ManualClock
from libs.common.core.runtime import Runtime
from libs.common.retention.cleanup import run_retention
from services.api.dashboard.session import CSRF_COOKIE, SESSION_COOKIE
from tests.conftest import Project, client_of, csrf_of, sign_in
from tests.dashboard_helpers import api, field_error
from tests.helpers import rows

#: The test client's host: its cookies are the server's cookies for this domain.
DOMAIN = "testserver.local"


def sequences_named(pool: ConnectionPool, name: str) -> int:
    [(found,)] = rows(pool, "SELECT count(*) FROM followup_sequences WHERE name = %s", name)
    return int(found)


def new_key(client: TestClient[Any], project: Project, scope: str) -> dict[str, Any]:
    created: dict[str, Any] = api(
        client, project, "POST", "/v1/api-keys", json={"name": scope, "scope": scope}
    )
    return created


def signed_in_with(client: TestClient[Any], key: str) -> str:
    """Sign ``client`` in with ``key``; the CSRF token of its session."""
    form = client.get("/app/sign-in")
    response = client.post(
        "/app/sign-in", data={"_csrf": csrf_of(form.text), "api_key": key}, follow_redirects=False
    )
    assert response.status_code == 303, response.text
    return csrf_of(client.get("/app/sequences").text)


# --- the session lives on the server -----------------------------------------------------------------------


def test_the_cookie_is_an_opaque_token_and_only_its_hash_is_stored(signed_in, project, pool) -> None:
    client, _ = signed_in
    token = client.cookies[SESSION_COOKIE]
    assert str(project.id) not in token and "." not in token and len(token) >= 43
    [(stored, key_id)] = rows(pool, "SELECT token_hash, api_key_id FROM dashboard_sessions")
    assert bytes(stored) == hashlib.sha256(token.encode()).digest()
    [(first_key,)] = rows(pool, "SELECT id FROM api_keys WHERE project_id = %s", project.id)
    assert key_id == first_key  # the session knows the key it signed in with


def browser(client: TestClient[Any], session: str) -> TestClient[Any]:
    """``client`` as the browser holding the session cookie ``session`` (and nothing else)."""
    client.cookies.clear()
    client.cookies.set(SESSION_COOKIE, session, domain=DOMAIN, path="/app")
    return client


def test_revoking_the_key_ends_its_sessions_at_their_next_request(app_client, project, pool) -> None:
    # two browsers: one signed in with the project's first key, one with a write key
    other_token = sign_in(app_client, project)
    other = app_client.cookies[SESSION_COOKIE]
    app_client.cookies.clear()
    key = new_key(app_client, project, "write")
    token = signed_in_with(app_client, key["api_key"])
    revoked = app_client.cookies[SESSION_COOKIE]
    api(app_client, project, "POST", f"/v1/api-keys/{key['key']['id']}/revoke")
    # the revoked key's browser is signed out: its pages go to the sign-in, its forms change nothing
    response = browser(app_client, revoked).get("/app/sequences", follow_redirects=False)
    assert response.status_code == 303
    assert response.headers["location"].startswith("/app/sign-in?next=")
    posted = browser(app_client, revoked).post(
        "/app/sequences/new", data={"_csrf": token, "name": "After revoke"}, follow_redirects=False
    )
    assert posted.status_code == 303 and posted.headers["location"].startswith("/app/sign-in")
    assert sequences_named(pool, "After revoke") == 0
    assert rows(pool, "SELECT count(*) FROM dashboard_sessions WHERE api_key_id = %s", key["key"]["id"]) == [
        (0,)
    ]
    # the other key's browser is still signed in
    assert browser(app_client, other).get("/app/sequences", follow_redirects=False).status_code == 200
    created = browser(app_client, other).post(
        "/app/sequences/new", data={"_csrf": other_token, "name": "Still in"}, follow_redirects=False
    )
    assert created.status_code == 303 and sequences_named(pool, "Still in") == 1


def test_a_session_ends_with_the_expiry_of_its_key(app_client, project, clock) -> None:
    created = api(
        app_client,
        project,
        "POST",
        "/v1/api-keys",
        json={"name": "short", "scope": "read", "expires_at": (clock.now() + timedelta(hours=1)).isoformat()},
    )
    signed_in_with(app_client, created["api_key"])
    assert app_client.get("/app/sequences", follow_redirects=False).status_code == 200
    clock.advance(timedelta(hours=1))
    assert app_client.get("/app/sequences", follow_redirects=False).status_code == 303


def test_sign_out_deletes_the_session_and_the_old_cookie_opens_nothing(signed_in, pool) -> None:
    client, token = signed_in
    cookie = client.cookies[SESSION_COOKIE]
    assert client.post("/app/sign-out", data={"_csrf": token}, follow_redirects=False).status_code == 303
    assert rows(pool, "SELECT count(*) FROM dashboard_sessions") == [(0,)]
    # a browser that kept the cookie (or someone who copied it) is signed out too
    client.cookies.set(SESSION_COOKIE, cookie, path="/app")
    assert client.get("/app/rules", follow_redirects=False).status_code == 303
    posted = client.post(
        "/app/sequences/new", data={"_csrf": token, "name": "Replayed"}, follow_redirects=False
    )
    assert posted.status_code in (303, 403) and sequences_named(pool, "Replayed") == 0


def test_signing_in_again_ends_the_previous_session(signed_in, project, pool) -> None:
    client, _ = signed_in
    first = client.cookies[SESSION_COOKIE]
    sign_in(client, project)
    assert client.cookies[SESSION_COOKIE] != first
    [(stored,)] = rows(pool, "SELECT token_hash FROM dashboard_sessions")
    assert bytes(stored) == hashlib.sha256(client.cookies[SESSION_COOKIE].encode()).digest()


def test_the_session_lifetime_is_a_setting_and_expired_sessions_are_cleaned_up(
    api_app: Litestar, runtime: Runtime, project: Project, pool: ConnectionPool, clock: ManualClock
) -> None:
    settings = replace(
        runtime.settings, api=msgspec.structs.replace(runtime.settings.api, dashboard_session_seconds=600)
    )
    with client_of(api_app, replace(runtime, settings=settings)) as client:
        response = client.post(
            "/app/sign-in",
            data={"_csrf": csrf_of(client.get("/app/sign-in").text), "api_key": project.api_key},
            follow_redirects=False,
        )
        cookie = next(c for c in response.headers.get_list("set-cookie") if c.startswith(SESSION_COOKIE))
        assert "max-age=600" in cookie.lower()
        first = client.cookies[SESSION_COOKIE]
        clock.advance(timedelta(seconds=599))
        assert client.get("/app/rules", follow_redirects=False).status_code == 200
        client.cookies.clear()
        sign_in(client, project)  # a second session, 599 s younger
        clock.advance(timedelta(seconds=1))
        assert browser(client, first).get("/app/rules", follow_redirects=False).status_code == 303
    [(expires_at,)] = rows(pool, "SELECT min(expires_at) FROM dashboard_sessions")
    assert expires_at == clock.now()
    assert run_retention(pool, clock.now) is True
    # the expired session's row went, the live one stayed
    assert rows(pool, "SELECT expires_at FROM dashboard_sessions") == [
        (clock.now() + timedelta(seconds=599),)
    ]


# --- sign-in CSRF -------------------------------------------------------------------------------------------


def test_a_planted_csrf_cookie_signs_nobody_in(app_client, project, other_project, pool) -> None:
    # the attacker's own sign-in form: a nonce (its cookie) and the token of that nonce
    form = app_client.get("/app/sign-in")
    planted, attackers_token = app_client.cookies[CSRF_COOKIE], csrf_of(form.text)
    forged = {"_csrf": attackers_token, "api_key": other_project.api_key}
    # the victim's browser carries the planted cookie; its sign-in page never reuses that nonce
    app_client.cookies.clear()
    app_client.cookies.set(CSRF_COOKIE, planted, domain=DOMAIN, path="/app")
    page = app_client.get("/app/sign-in")
    assert app_client.cookies[CSRF_COOKIE] != planted
    assert csrf_of(page.text) != attackers_token and attackers_token not in page.text
    # the attacker's form posted from the victim's browser after that: refused, nobody signed in
    refused = app_client.post("/app/sign-in", data=forged, follow_redirects=False)
    assert refused.status_code == 403 and SESSION_COOKIE not in refused.headers.get("set-cookie", "")
    # planted again (after the page), the cookie and the token come from another site's page: refused
    app_client.cookies.clear()
    app_client.cookies.set(CSRF_COOKIE, planted, domain=DOMAIN, path="/app")
    for headers in (
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
        {"Origin": "https://evil.example"},
        {"Origin": "null"},
    ):
        refused = app_client.post("/app/sign-in", data=forged, headers=headers, follow_redirects=False)
        assert refused.status_code == 403, headers
        assert SESSION_COOKIE not in refused.headers.get("set-cookie", ""), headers
    assert rows(pool, "SELECT count(*) FROM dashboard_sessions") == [(0,)]
    # the victim's own form, posted from the dashboard's page, signs the victim in
    app_client.cookies.clear()
    own = app_client.get("/app/sign-in")
    signed = app_client.post(
        "/app/sign-in",
        data={"_csrf": csrf_of(own.text), "api_key": project.api_key},
        headers={"Sec-Fetch-Site": "same-origin", "Origin": f"http://{DOMAIN}"},
        follow_redirects=False,
    )
    assert signed.status_code == 303
    [(session_project,)] = rows(pool, "SELECT project_id FROM dashboard_sessions")
    assert session_project == project.id


# --- next ---------------------------------------------------------------------------------------------------


def test_a_next_with_control_characters_or_outside_the_dashboard_goes_home_never_500(
    app_client, project
) -> None:
    bad = [
        "/app/rules\r\nSet-Cookie: x=1",
        "/app/rules\nLocation: https://evil.example",
        "/app/\x00",
        "/app/\t",
        "/app/ rules",
        "/app/règles",
        "/app/../v1/rules",
        "/app/./x",
    ]
    for target in bad:
        page = app_client.get("/app/sign-in", params={"next": target})
        assert page.status_code == 200, target
        assert 'name="next" value="/app/"' in page.text, target
        response = app_client.post(
            "/app/sign-in",
            data={"_csrf": csrf_of(page.text), "api_key": project.api_key, "next": target},
            follow_redirects=False,
        )
        assert response.status_code == 303 and response.headers["location"] == "/app/", target
        app_client.cookies.clear()
    # a page's own query comes along through the redirect to the sign-in, quoted
    response = app_client.get("/app/sequences", params={"q": "a\r\nb"}, follow_redirects=False)
    assert response.status_code == 303 and "\r" not in response.headers["location"]
    assert response.headers["location"] == "/app/sign-in?next=/app/sequences%3Fq%3Da%250D%250Ab"


# --- scopes in the dashboard ----------------------------------------------------------------------------


def test_a_read_key_sees_every_page_and_changes_nothing(app_client, project, pool) -> None:
    token = signed_in_with(app_client, new_key(app_client, project, "read")["api_key"])
    for path in ("/app/sequences", "/app/rules", "/app/contacts", "/app/settings", "/app/enrollments"):
        assert app_client.get(path).status_code == 200, path
    refused = app_client.post("/app/sequences/new", data={"_csrf": token, "name": "Read only"})
    assert refused.status_code == 403 and "`write` scope" in refused.text
    assert sequences_named(pool, "Read only") == 0
    assert app_client.post("/app/sign-out", data={"_csrf": token}, follow_redirects=False).status_code == 303


def test_an_events_key_does_not_sign_in(app_client, project, pool) -> None:
    key = new_key(app_client, project, "events")["api_key"]
    form = app_client.get("/app/sign-in")
    response = app_client.post("/app/sign-in", data={"_csrf": csrf_of(form.text), "api_key": key})
    assert response.status_code == 401
    assert "`events`" in field_error(response.text, "api_key")
    assert rows(pool, "SELECT count(*) FROM dashboard_sessions") == [(0,)]
