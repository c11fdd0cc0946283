"""The web dashboard's frame (``/app/``) over HTTP: signing in and out, the session cookie, CSRF on
every form, the empty state of every list and every page, another project's ids (404), and HTML in every
user-editable field (escaped)."""

from __future__ import annotations

import html
import json
import re
import secrets
from datetime import timedelta
from typing import Any

import pytest
from litestar.testing import TestClient

from libs.common.core.runtime import Runtime
from libs.common.core.settings import ApiSettings
from services.api.dashboard.session import SESSION_COOKIE, Signer, secret_from_environment
from services.release.release import release_one
from tests.conftest import Project, csrf_of, sign_in
from tests.dashboard_helpers import (
    add_step,
    api,
    bulk_upload,
    create_rule_via_form,
    enroll,
    errors_on,
    field_error,
    make_sequence_via_form,
    publish,
)
from tests.helpers import rows
from tests.rule_helpers import process

XSS = '<script>alert("x")</script>'
ESCAPED = html.escape(XSS, quote=False)


def no_raw_script(page: str) -> None:
    assert "<script>alert" not in page
    assert page.count("<script") == 1  # the dashboard's own script tag, in the head


# --- the frame: sign-in, session, CSRF ----------------------------------------------------------------------


def test_pages_need_a_session_and_signing_in_returns_to_the_page(app_client, project) -> None:
    response = app_client.get("/app/sequences", follow_redirects=False)
    assert response.status_code == 303
    assert response.headers["location"] == "/app/sign-in?next=/app/sequences"
    page = app_client.get(response.headers["location"])
    assert 'name="next" value="/app/sequences"' in page.text
    signed = app_client.post(
        "/app/sign-in",
        data={"_csrf": csrf_of(page.text), "api_key": project.api_key, "next": "/app/sequences"},
        follow_redirects=False,
    )
    assert signed.headers["location"] == "/app/sequences"
    assert app_client.get("/app/sequences").status_code == 200
    # the query comes along
    app_client.cookies.clear()
    response = app_client.get("/app/enrollments/new?sequence_id=abc", follow_redirects=False)
    assert response.headers["location"] == "/app/sign-in?next=/app/enrollments/new%3Fsequence_id%3Dabc"
    assert (
        'name="next" value="/app/enrollments/new?sequence_id=abc"'
        in app_client.get(response.headers["location"]).text
    )


def test_the_session_cookie_is_http_only_strict_and_carries_no_key(app_client, project) -> None:
    form = app_client.get("/app/sign-in")
    assert "httponly" in form.headers["set-cookie"].lower()  # the pre-session CSRF nonce
    response = app_client.post(
        "/app/sign-in",
        data={"_csrf": csrf_of(form.text), "api_key": project.api_key},
        follow_redirects=False,
    )
    cookie = next(c for c in response.headers.get_list("set-cookie") if c.startswith(SESSION_COOKIE))
    attributes = cookie.lower()
    assert "httponly" in attributes and "samesite=strict" in attributes and "path=/app" in attributes
    assert project.api_key not in cookie
    assert response.headers["location"] == "/app/"


def test_a_wrong_key_is_shown_next_to_its_field(app_client) -> None:
    form = app_client.get("/app/sign-in")
    for key in ("fu_not-a-key", "", "something"):
        response = app_client.post("/app/sign-in", data={"_csrf": csrf_of(form.text), "api_key": key})
        assert response.status_code == 401
        assert field_error(response.text, "api_key")
        assert SESSION_COOKIE not in response.headers.get("set-cookie", "")


def test_sign_in_goes_only_to_dashboard_pages(app_client, project) -> None:
    for target in ("https://evil.example/", "//evil.example/app/", "/app/\\evil", "/v1/rules"):
        form = app_client.get("/app/sign-in")
        response = app_client.post(
            "/app/sign-in",
            data={"_csrf": csrf_of(form.text), "api_key": project.api_key, "next": target},
            follow_redirects=False,
        )
        assert response.headers["location"] == "/app/", target


def test_sign_out_ends_the_session(signed_in) -> None:
    client, token = signed_in
    response = client.post("/app/sign-out", data={"_csrf": token}, follow_redirects=False)
    assert response.status_code == 303
    assert response.headers["location"] == "/app/sign-in?notice=signed_out"
    assert client.get("/app/rules", follow_redirects=False).status_code == 303
    assert "You are signed out." in client.get("/app/sign-in?notice=signed_out").text


def test_a_forged_or_missing_csrf_token_is_403(signed_in, project) -> None:
    client, token = signed_in
    sequence_id = make_sequence_via_form(client, token, "Forged")
    rule_id = create_rule_via_form(
        client,
        token,
        name="r",
        event="contact.created",
        execute="immediately",
        **{"actions.0.type": "add_contact_tag", "actions.0.tags": "x"},
    )
    posts = [
        ("/app/sign-out", {}),
        (f"/app/rules/{rule_id}/test", {"contact": "+14155550100"}),
        ("/app/rules/new", {"name": "r", "event": "contact.created"}),
        ("/app/sequences/new", {"name": "s"}),
        (f"/app/sequences/{sequence_id}/publish", {}),
        ("/app/settings", {"consent_mode": "required"}),
        ("/app/contacts/new", {"phone": "+14155550100"}),
        ("/app/enrollments/new", {"sequence_id": sequence_id, "contact": "+14155550100"}),
    ]
    other_signer = Signer(b"x" * 32)
    for path, data in posts:
        for forged in (None, "", "forged", token[:-2] + "AA", other_signer.csrf_token("nonce")):
            body = dict(data) if forged is None else {**data, "_csrf": forged}
            response = client.post(path, data=body, follow_redirects=False)
            assert response.status_code == 403, (path, forged, response.status_code)
            assert "did not come from this dashboard" in response.text
    # the header works for scripts, the token of another session does not
    assert (
        client.post("/app/sequences/new", data={"name": "h"}, headers={"X-CSRF-Token": token}).status_code
        == 200
    )
    sign_in(client, project)  # a new session: the old one's token is worth nothing in it
    response = client.post("/app/sequences/new", data={"name": "x", "_csrf": token}, follow_redirects=False)
    assert response.status_code == 403
    # nothing was changed by the refused posts
    assert "Forged" in client.get("/app/sequences").text
    assert client.get(f"/app/sequences/{sequence_id}").text.count("Not published yet") == 1


def test_a_tampered_expired_or_made_up_session_is_no_session(app_client, project, clock) -> None:
    for value in (secrets.token_urlsafe(32), "garbage", "a.b", ""):
        app_client.cookies.set(SESSION_COOKIE, value, path="/app")
        assert app_client.get("/app/rules", follow_redirects=False).status_code == 303
    # a genuine token altered by one character is refused; the genuine one works until its lifetime ends
    app_client.cookies.clear()
    sign_in(app_client, project)
    genuine = app_client.cookies[SESSION_COOKIE]
    altered = genuine[:-1] + ("A" if genuine[-1] != "A" else "B")
    app_client.cookies.set(SESSION_COOKIE, altered, path="/app")
    assert app_client.get("/app/rules", follow_redirects=False).status_code == 303
    app_client.cookies.set(SESSION_COOKIE, genuine, path="/app")
    assert app_client.get("/app/rules", follow_redirects=False).status_code == 200
    clock.advance(timedelta(seconds=ApiSettings().dashboard_session_seconds - 1))
    assert app_client.get("/app/rules", follow_redirects=False).status_code == 200
    clock.advance(timedelta(seconds=1))
    assert app_client.get("/app/rules", follow_redirects=False).status_code == 303


def test_the_secret_comes_from_the_environment() -> None:
    assert secret_from_environment({"DASHBOARD_SECRET": "k" * 40}) == b"k" * 40
    assert len(secret_from_environment({})) == 32
    assert secret_from_environment({}) != secret_from_environment({})
    from libs.common.core.settings import SettingsError

    with pytest.raises(SettingsError, match="DASHBOARD_SECRET"):
        secret_from_environment({"DASHBOARD_SECRET": "short"})


def test_pages_are_sent_with_a_content_security_policy(signed_in) -> None:
    client, _ = signed_in
    response = client.get("/app/rules")
    assert "script-src 'self'" in response.headers["content-security-policy"]
    assert response.headers["x-frame-options"] == "DENY"
    assert client.get("/app/static/dashboard.js").status_code == 200
    assert client.get("/app/static/dashboard.css").status_code == 200


# --- every page, empty states -------------------------------------------------------------------------------

EMPTY_STATES = {
    "/app/sequences": "No sequences yet",
    "/app/enrollments": "No enrollments yet",
    "/app/rules": "No rules yet",
    "/app/contacts": "No contacts yet",
    "/app/bulk": "No bulk enrollments yet",
    "/app/settings": "No numbers registered",
}


def test_every_list_has_an_empty_state(signed_in) -> None:
    client, _ = signed_in
    for path, text in EMPTY_STATES.items():
        response = client.get(path)
        assert response.status_code == 200, path
        assert 'class="empty-state"' in response.text and text in response.text, path
        assert 'aria-current="page"' in response.text


def test_every_page_renders_with_labelled_fields(signed_in, project, runtime, pool, clock) -> None:
    client, token = signed_in
    world = populate(client, token, project, runtime)
    pages = [
        "/app/sequences",
        f"/app/sequences/{world['sequence_id']}",
        f"/app/sequences/{world['sequence_id']}/steps/new?kind=message",
        f"/app/sequences/{world['sequence_id']}/steps/new?kind=ai",
        f"/app/sequences/{world['sequence_id']}/steps/new?kind=reminder",
        f"/app/sequences/{world['sequence_id']}/steps/0",
        f"/app/sequences/{world['sequence_id']}/versions",
        f"/app/sequences/{world['sequence_id']}/versions?from=1&to=2",
        f"/app/sequences/{world['sequence_id']}/results",
        "/app/enrollments",
        f"/app/enrollments?sequence_id={world['sequence_id']}&status=active",
        "/app/enrollments/new",
        f"/app/enrollments/{world['enrollment_id']}",
        f"/app/enrollments/{world['enrollment_id']}/timeline",
        "/app/rules",
        "/app/rules/new",
        f"/app/rules/{world['rule_id']}",
        f"/app/rules/{world['rule_id']}?status=pending",
        f"/app/rules/{world['rule_id']}/edit",
        "/app/contacts",
        f"/app/contacts/{world['contact_id']}",
        "/app/settings",
        "/app/bulk",
        "/app/bulk/new",
        f"/app/bulk/{world['job_id']}",
        f"/app/bulk/{world['job_id']}/progress",
        "/app/api-keys",
    ]
    for path in pages:
        response = client.get(path)
        assert response.status_code == 200, (path, response.text[-800:])
        assert response.headers["content-type"].startswith("text/html")
        unlabelled = unlabelled_inputs(response.text)
        assert not unlabelled, (path, unlabelled)


def unlabelled_inputs(page: str) -> list[str]:
    """Inputs, selects and textareas without a ``<label for>`` (hidden inputs and buttons need none)."""
    labelled = set(re.findall(r'<label[^>]*for="([^"]+)"', page))
    missing = []
    for tag in re.findall(r"<(?:input|select|textarea)\b[^>]*>", page):
        if 'type="hidden"' in tag or 'type="submit"' in tag:
            continue
        found = re.search(r'id="([^"]+)"', tag)
        if not found or found.group(1) not in labelled:
            missing.append(tag)
    return missing


def test_unknown_dashboard_addresses_are_404(signed_in) -> None:
    client, _ = signed_in
    response = client.get("/app/no-such-page")
    assert response.status_code == 404
    assert "Nothing like this exists in this project." in response.text


# --- another project's ids ----------------------------------------------------------------------------------


def test_another_projects_ids_are_404(signed_in, project, other_project, runtime) -> None:
    client, token = signed_in
    # Given everything of the other project
    client.cookies.clear()
    other_token = sign_in(client, other_project)
    theirs = populate(client, other_token, other_project, runtime)
    client.cookies.clear()
    token = sign_in(client, project)
    # When this project's session asks for them, by page or by action
    gets = [
        f"/app/sequences/{theirs['sequence_id']}",
        f"/app/sequences/{theirs['sequence_id']}/steps/0",
        f"/app/sequences/{theirs['sequence_id']}/steps/new",
        f"/app/sequences/{theirs['sequence_id']}/versions",
        f"/app/sequences/{theirs['sequence_id']}/results",
        f"/app/enrollments/{theirs['enrollment_id']}",
        f"/app/enrollments/{theirs['enrollment_id']}/timeline",
        f"/app/rules/{theirs['rule_id']}",
        f"/app/rules/{theirs['rule_id']}/edit",
        f"/app/contacts/{theirs['contact_id']}",
        f"/app/bulk/{theirs['job_id']}",
        f"/app/bulk/{theirs['job_id']}/progress",
        f"/app/bulk/{theirs['job_id']}/skipped.csv",
    ]
    for path in gets:
        response = client.get(path)
        assert response.status_code == 404, (path, response.status_code)
        assert "Nothing like this exists in this project." in response.text
    posts = [
        f"/app/sequences/{theirs['sequence_id']}/publish",
        f"/app/sequences/{theirs['sequence_id']}/pause",
        f"/app/sequences/{theirs['sequence_id']}/resume",
        f"/app/sequences/{theirs['sequence_id']}/archive",
        f"/app/sequences/{theirs['sequence_id']}/rename",
        f"/app/sequences/{theirs['sequence_id']}/options",
        f"/app/sequences/{theirs['sequence_id']}/steps/new",
        f"/app/sequences/{theirs['sequence_id']}/steps/0",
        f"/app/sequences/{theirs['sequence_id']}/steps/0/move",
        f"/app/sequences/{theirs['sequence_id']}/steps/0/remove",
        f"/app/enrollments/{theirs['enrollment_id']}/pause",
        f"/app/enrollments/{theirs['enrollment_id']}/resume",
        f"/app/enrollments/{theirs['enrollment_id']}/stop",
        f"/app/rules/{theirs['rule_id']}/edit",
        f"/app/rules/{theirs['rule_id']}/enable",
        f"/app/rules/{theirs['rule_id']}/disable",
        f"/app/rules/{theirs['rule_id']}/delete",
        f"/app/rules/{theirs['rule_id']}/test",
        f"/app/bulk/{theirs['job_id']}/cancel",
    ]
    for path in posts:
        response = client.post(
            path, data={"_csrf": token, "name": "mine now", "note": "x"}, follow_redirects=False
        )
        assert response.status_code == 404, (path, response.status_code)
    # Then nothing of theirs changed, and nothing of theirs is listed here
    assert rows(
        runtime.pool, "SELECT status FROM followup_enrollments WHERE id = %s", theirs["enrollment_id"]
    ) == [("active",)]
    assert rows(runtime.pool, "SELECT name, active FROM rules WHERE id = %s", theirs["rule_id"]) == [
        (f"rule {XSS}", True)
    ]
    for path in EMPTY_STATES:
        assert "empty-state" in client.get(path).text, path
    enrolling = client.post(
        "/app/enrollments/new",
        data={"_csrf": token, "sequence_id": theirs["sequence_id"], "contact": theirs["contact_id"]},
    )
    assert enrolling.status_code == 404
    assert field_error(enrolling.text, "contact") == "contact not found"


# --- escaping -----------------------------------------------------------------------------------------------


def populate(client: TestClient[Any], token: str, project: Project, runtime: Runtime) -> dict[str, str]:
    """One of everything, with ``<script>`` in every field a user can type into: a contact (name, attribute),
    a two-step sequence (name, texts, instructions, goal, fallback, template parameter) published twice,
    an enrollment (variables) stopped with a note and a live one, a delayed rule (name, condition value,
    custom key, actions' texts) with a pending execution, and a bulk job (variables)."""
    contact = api(
        client,
        project,
        "POST",
        "/v1/contacts",
        json={"phone": "+14155550123", "name": f"Ada {XSS}", "attributes": {"note": XSS}, "tags": ["vip"]},
    )
    other = api(client, project, "POST", "/v1/contacts", json={"phone": "+14155550124", "name": f"Bob {XSS}"})
    sequence_id = make_sequence_via_form(client, token, f"Seq {XSS}")
    add_step(client, token, sequence_id, text=f"Hi {XSS} {{{{contact.name}}}}")
    add_step(
        client,
        token,
        sequence_id,
        kind="ai",
        instructions=f"Ask {XSS}",
        goal=XSS,
        **{
            "fallback.kind": "template",
            "fallback.text": f"Still {XSS}?",
            "wait_value": "1",
            "wait_unit": "days",
        },
    )
    publish(client, token, sequence_id)
    add_step(
        client,
        token,
        sequence_id,
        text=f"Third {XSS}",
        **{"whatsapp_template.name": "t1", "whatsapp_template.parameters": XSS},
    )
    publish(client, token, sequence_id)
    stopped = enroll(client, token, sequence_id, contact["phone"], variables=f"x={XSS}")
    response = client.post(f"/app/enrollments/{stopped}/stop", data={"_csrf": token, "note": f"note {XSS}"})
    assert response.status_code == 200
    live = enroll(client, token, sequence_id, other["phone"], variables=f"x={XSS}")
    release_one(runtime.pool, runtime.clock, runtime.settings.followup)
    rule_id = create_rule_via_form(
        client,
        token,
        name=f"rule {XSS}",
        event="contact.created",
        execute="delayed",
        delay_value="4",
        delay_unit="hours",
        **{
            "conditions.kind": "all",
            "conditions.all.0.attribute": "custom",
            "conditions.all.0.custom_key": f"k{XSS}",
            "conditions.all.0.operator": "not_equal_to",
            "conditions.all.0.value": XSS,
            "conditions.all.0.type": "text",
            "actions.0.type": "send_message",
            "actions.0.text": f"Hello {XSS}",
            "actions.1.type": "add_private_note",
            "actions.1.text": f"Note {XSS}",
            "actions.2.type": "assign_team",
            "actions.2.team": f"team {XSS}",
        },
    )
    third = api(client, project, "POST", "/v1/contacts", json={"phone": "+14155550125", "name": f"Cy {XSS}"})
    process(runtime)
    job = bulk_upload(client, token, sequence_id, "phone\n+14155550123\n+14155550199\n", variables=f"v={XSS}")
    return {
        "contact_id": third["id"],
        "sequence_id": sequence_id,
        "enrollment_id": live,
        "stopped_id": stopped,
        "rule_id": rule_id,
        "job_id": job,
    }


def test_html_in_every_user_editable_field_is_escaped(signed_in, project, runtime) -> None:
    client, token = signed_in
    world = populate(client, token, project, runtime)
    contact_of_live = rows(
        runtime.pool, "SELECT contact_id FROM followup_enrollments WHERE id = %s", world["enrollment_id"]
    )[0][0]
    pages = {
        "/app/sequences": ["Seq "],
        f"/app/sequences/{world['sequence_id']}": ["Seq ", "Hi ", "Ask ", "Still ", "Third "],
        f"/app/sequences/{world['sequence_id']}/steps/1": ["Ask ", "Still "],
        f"/app/sequences/{world['sequence_id']}/steps/2": ["Third "],
        f"/app/sequences/{world['sequence_id']}/versions?from=1&to=2": ["Third "],
        f"/app/sequences/{world['sequence_id']}/results": ["Seq "],
        "/app/enrollments": ["Ada ", "Bob ", "Seq "],
        f"/app/enrollments/{world['stopped_id']}": ["note ", "Ada "],
        f"/app/enrollments/{world['enrollment_id']}": ["Hi ", "Bob "],
        "/app/rules": ["rule ", "Hello ", "Note ", "team "],
        f"/app/rules/{world['rule_id']}": ["rule ", "Hello "],
        f"/app/rules/{world['rule_id']}/edit": ["rule ", "Hello ", "Note ", "team "],
        "/app/contacts": ["Ada ", "Bob ", "Cy "],
        f"/app/contacts/{contact_of_live}": ["Bob ", "Seq "],
        f"/app/contacts/{world['contact_id']}": ["Cy ", "rule "],
        "/app/bulk": ["Seq "],
        f"/app/bulk/{world['job_id']}": ["Seq "],
    }
    for path, prefixes in pages.items():
        page = client.get(path).text
        no_raw_script(page)
        for prefix in prefixes:
            assert html.escape(prefix, quote=False) + ESCAPED in page.replace("&#34;", '"'), (path, prefix)
    # a rule tested against a contact: the condition's custom key and value, the contact's attribute and the
    # event's data as the tree shows them
    tested = client.post(
        f"/app/rules/{world['rule_id']}/test",
        data={"_csrf": token, "contact": str(contact_of_live), "event": json.dumps({"tags_added": [XSS]})},
    )
    assert tested.status_code == 200, errors_on(tested.text)
    no_raw_script(tested.text)
    assert f"“k{ESCAPED}”" in tested.text.replace("&#34;", '"')  # the condition's custom key
    refused = client.post(
        f"/app/rules/{world['rule_id']}/test",
        data={"_csrf": token, "contact": str(contact_of_live), "event": "{" + XSS},
    )
    assert refused.status_code == 422
    no_raw_script(refused.text)
    assert field_error(refused.text, "event").startswith("not JSON")
    # the values typed into forms come back escaped too (a refused form is drawn again with them)
    response = client.post("/app/sequences/new", data={"_csrf": token, "name": "x" * 300 + XSS})
    assert response.status_code == 422
    no_raw_script(response.text)
    response = client.post(
        "/app/rules/new",
        data={
            "_csrf": token,
            "name": XSS,
            "event": "contact.created",
            "actions.0.type": "add_label",
            "actions.0.labels": XSS,
            "_op": "save",
        },
    )
    assert response.status_code == 422
    no_raw_script(response.text)
    assert field_error(response.text, "actions.0.labels").startswith("actions.0.labels.0:")
