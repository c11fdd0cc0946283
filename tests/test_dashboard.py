"""The web dashboard (``/app/``) over HTTP: signing in and out, the session cookie, CSRF on every form,
another project's ids (404), HTML in every user-editable field (escaped), the empty state of every list,
every page; and each page's work: rules (the delay in units, all / any groups, executions), the sequence
builder (steps, publish, versions and what changed, pause / resume / archive, preview), enrollments
(filters, timeline, pause / resume / stop with a note, enrolling one contact), settings, results, the
contact card and bulk enrollment from a CSV.

Forms are posted as a browser posts them; field errors are asserted next to the input they name (the
``f-<field>-error`` paragraph that the input's ``aria-describedby`` points at).
"""

from __future__ import annotations

import html
import re
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import TestClient

from libs.common.core.runtime import Runtime
from libs.common.followups.definition import MessageStep
from libs.common.followups.statistics import daily_activity, sequence_counts
from libs.common.rules import executions, rules
from libs.common.rules.bulk import process_chunk
from services.api.dashboard.forms import field_id
from services.api.dashboard.session import (
    SESSION_COOKIE,
    Session,
    Signer,
    secret_from_environment,
)
from services.release.release import release_one
from tests.conftest import Project, client_of
from tests.factories import make_contact, make_enrollment, make_sequence
from tests.helpers import rows
from tests.rule_helpers import process

XSS = '<script>alert("x")</script>'
ESCAPED = html.escape(XSS, quote=False)


# --- helpers ------------------------------------------------------------------------------------------------


def csrf_of(page: str) -> str:
    found = re.search(r'name="_csrf" value="([^"]+)"', page)
    assert found, "no CSRF field on the page"
    return found.group(1)


def sign_in(client: TestClient[Any], project: Project) -> str:
    """Sign ``client`` in as ``project``; the CSRF token of its session."""
    form = client.get("/app/sign-in")
    response = client.post(
        "/app/sign-in",
        data={"_csrf": csrf_of(form.text), "api_key": project.api_key, "next": "/app/rules"},
        follow_redirects=False,
    )
    assert response.status_code == 303, response.text
    assert response.headers["location"] == "/app/rules"
    return csrf_of(client.get("/app/rules").text)


def field_error(page: str, name: str) -> str:
    """The error shown next to the input named ``name`` (fails when there is none)."""
    found = re.search(rf'<p class="field-error" id="{re.escape(field_id(name))}-error">(.*?)</p>', page, re.S)
    assert found, f"no error next to {name}: {errors_on(page)}"
    return html.unescape(re.sub(r"<[^>]+>", "", found.group(1))).removeprefix("Error: ")


def errors_on(page: str) -> list[str]:
    return [
        html.unescape(re.sub(r"<[^>]+>", "", m))
        for m in re.findall(r'class="field-error"[^>]*>(.*?)</p>', page, re.S)
    ]


def no_raw_script(page: str) -> None:
    assert "<script>alert" not in page
    assert page.count("<script") == 1  # the dashboard's own script tag, in the head


@pytest.fixture
def app_client(api_app: Litestar, runtime: Runtime) -> Iterator[TestClient[Any]]:
    with client_of(api_app, runtime) as client:
        yield client


@pytest.fixture
def signed_in(app_client: TestClient[Any], project: Project) -> tuple[TestClient[Any], str]:
    """A client signed in as ``project``, and its CSRF token."""
    return app_client, sign_in(app_client, project)


def api(client: TestClient[Any], project: Project, method: str, path: str, **kwargs: Any) -> Any:
    response = client.request(method, path, headers=project.headers, **kwargs)
    assert response.status_code < 300, response.text
    return response.json() if response.content else None


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
    posts = [
        ("/app/sign-out", {}),
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


def test_a_tampered_expired_or_foreign_session_is_no_session(app_client, project) -> None:
    signer = Signer(secret_from_environment({}))
    foreign = signer.session_cookie_value(Session(project.id, "nonce", 4_102_444_800))
    for value in (foreign, "garbage", "a.b", ""):
        app_client.cookies.set(SESSION_COOKIE, value, path="/app")
        assert app_client.get("/app/rules", follow_redirects=False).status_code == 303
    # a genuine cookie altered by one character, and one that expired, are refused too
    token_page = app_client.get("/app/sign-in")
    signed = app_client.post(
        "/app/sign-in",
        data={"_csrf": csrf_of(token_page.text), "api_key": project.api_key},
        follow_redirects=False,
    )
    genuine = signed.cookies[SESSION_COOKIE]
    payload, mac = genuine.split(".")
    altered = payload[:-1] + ("A" if payload[-1] != "A" else "B") + "." + mac
    app_client.cookies.clear()
    app_client.cookies.set(SESSION_COOKIE, altered, path="/app")
    assert app_client.get("/app/rules", follow_redirects=False).status_code == 303
    assert (
        Signer(b"s" * 32).session_from(
            Signer(b"s" * 32).session_cookie_value(Session(project.id, "n", 100)), now=101
        )
        is None
    )


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


# --- rules --------------------------------------------------------------------------------------------------


def create_rule_via_form(client: TestClient[Any], token: str, **fields: str) -> str:
    response = client.post(
        "/app/rules/new",
        data={"_csrf": token, "active": "on", "_op": "save", **fields},
        follow_redirects=False,
    )
    assert response.status_code == 303, errors_on(response.text)
    return response.headers["location"].split("/")[3].split("?")[0]


def test_the_rule_form_stores_the_delay_in_minutes_and_the_list_shows_the_badge(
    signed_in, project, runtime
) -> None:
    client, token = signed_in
    label = {"actions.0.type": "add_label", "actions.0.labels": "stale"}
    four_hours = create_rule_via_form(
        client,
        token,
        name="stale pending",
        event="conversation.updated",
        execute="delayed",
        delay_value="4",
        delay_unit="hours",
        **label,
    )
    two_days = create_rule_via_form(
        client,
        token,
        name="two days",
        event="message.created",
        execute="delayed",
        delay_value="2",
        delay_unit="days",
        **label,
    )
    at_once = create_rule_via_form(
        client,
        token,
        name="at once",
        event="message.created",
        execute="immediately",
        delay_value="4",
        delay_unit="hours",
        **label,
    )
    stored = dict(rows(runtime.pool, "SELECT id::text, execution_delay_minutes FROM rules"))
    assert stored == {four_hours: 240, two_days: 2880, at_once: None}
    listing = client.get("/app/rules").text
    assert listing.count('<span class="badge">runs after 4h</span>') == 1
    assert listing.count('<span class="badge">runs after 2d</span>') == 1
    assert "immediately" in listing
    # the edit form shows the delay in its largest unit
    edit = client.get(f"/app/rules/{four_hours}/edit").text
    assert 'name="delay_value" value="4"' in edit
    assert '<option value="hours" selected>' in edit
    assert 'id="execute-delayed" name="execute" value="delayed" checked' in edit
    # 90 minutes stays in minutes
    response = client.post(
        f"/app/rules/{four_hours}/edit",
        data={
            "_csrf": token,
            "name": "stale pending",
            "event": "conversation.updated",
            "execute": "delayed",
            "delay_value": "90",
            "delay_unit": "minutes",
            "active": "on",
            "_op": "save",
            **label,
        },
        follow_redirects=False,
    )
    assert response.status_code == 303
    assert rows(runtime.pool, "SELECT execution_delay_minutes FROM rules WHERE id = %s", four_hours) == [
        (90,)
    ]
    assert "runs after 1h 30m" in client.get("/app/rules").text


@pytest.mark.parametrize(
    ("fields", "name", "message"),
    [
        (
            {"execute": "delayed", "delay_value": "0", "delay_unit": "hours"},
            "execution_delay_minutes",
            ">= 1",
        ),
        (
            {"execute": "delayed", "delay_value": "31", "delay_unit": "days"},
            "execution_delay_minutes",
            "<= 43200",
        ),
        (
            {"execute": "delayed", "delay_value": "soon", "delay_unit": "hours"},
            "execution_delay_minutes",
            "whole number",
        ),
        ({"name": "  "}, "name", "1 to 200 characters"),
        (
            {"conditions.all.0.attribute": "", "conditions.all.0.operator": "equal_to"},
            "conditions.all.0.attribute",
            "attribute is required",
        ),
        (
            {
                "conditions.all.0.attribute": "contact.tags",
                "conditions.all.0.operator": "starts_with",
                "conditions.all.0.value": "v",
            },
            "conditions.all.0.operator",
            "does not apply",
        ),
        (
            {
                "conditions.all.0.attribute": "custom",
                "conditions.all.0.custom_key": "score",
                "conditions.all.0.operator": "is_greater_than",
                "conditions.all.0.value": "high",
                "conditions.all.0.type": "number",
            },
            "conditions.all.0.value",
            "'high' is not a number",
        ),
        (
            {
                "conditions.all.0.attribute": "contact.opted_out",
                "conditions.all.0.operator": "equal_to",
                "conditions.all.0.value": "yes",
                "conditions.all.0.type": "text",
            },
            "conditions.all.0.value",
            "the value must be true or false",
        ),
        ({"actions.0.labels": "ok, bad label!"}, "actions.0.labels", "not a valid tag"),
        (
            {"actions.0.type": "snooze_until", "actions.0.minutes": "forever"},
            "actions.0.minutes",
            "Expected `int`",
        ),
        (
            {"actions.0.type": "enroll_in_sequence", "actions.0.sequence_id": str(uuid.uuid4())},
            "actions.0.sequence_id",
            "sequence not found",
        ),
    ],
)
def test_rule_errors_are_shown_next_to_their_field(signed_in, runtime, fields, name, message) -> None:
    client, token = signed_in
    data = {
        "_csrf": token,
        "_op": "save",
        "name": "r",
        "event": "message.created",
        "execute": "immediately",
        "conditions.kind": "all",
        "actions.0.type": "add_label",
        "actions.0.labels": "x",
    } | fields
    response = client.post("/app/rules/new", data=data)
    assert response.status_code in (404, 422), response.status_code
    assert message in field_error(response.text, name)
    assert 'class="error-summary"' in response.text
    assert rows(runtime.pool, "SELECT count(*) FROM rules") == [(0,)]


def test_the_condition_builder_nests_all_and_any_groups(signed_in, project, runtime) -> None:
    client, token = signed_in
    base = {
        "_csrf": token,
        "name": "price",
        "event": "message.created",
        "execute": "immediately",
        "actions.0.type": "add_label",
        "actions.0.labels": "pricing",
        "active": "on",
    }
    # the builder's buttons change the form and save nothing
    step1 = client.post(
        "/app/rules/new", data=base | {"conditions.kind": "all", "_op": "add_leaf:conditions"}
    )
    assert 'name="conditions.all.0.attribute"' in step1.text
    step2 = client.post(
        "/app/rules/new",
        data=base
        | {
            "conditions.kind": "all",
            "conditions.all.0.attribute": "message.type",
            "conditions.all.0.operator": "equal_to",
            "conditions.all.0.value": "incoming",
            "_op": "add_group:conditions",
        },
    )
    assert (
        'name="conditions.all.1.kind"' in step2.text
        and 'name="conditions.all.1.any.0.attribute"' in step2.text
    )
    step3 = client.post(
        "/app/rules/new",
        data=base
        | {"conditions.kind": "all", "conditions.all.1.kind": "any", "_op": "add_leaf:conditions.all.1"},
    )
    assert 'name="conditions.all.0.any.0.attribute"' in step3.text  # the group is now the first child
    removed = client.post(
        "/app/rules/new",
        data=base
        | {
            "conditions.kind": "all",
            "conditions.all.0.attribute": "message.type",
            "conditions.all.1.kind": "any",
            "conditions.all.1.any.0.attribute": "message.content",
            "_op": "remove:conditions.all.1",
        },
    )
    assert "conditions.all.1" not in removed.text
    assert rows(runtime.pool, "SELECT count(*) FROM rules") == [(0,)]
    # saving the tree (a group whose kind was switched from all to any keeps its children)
    rule_id = create_rule_via_form(
        client,
        token,
        **{k: v for k, v in base.items() if k != "_csrf"},
        **{
            "conditions.kind": "all",
            "conditions.all.0.attribute": "message.type",
            "conditions.all.0.operator": "equal_to",
            "conditions.all.0.value": "incoming",
            "conditions.all.0.type": "text",
            "conditions.all.1.kind": "any",
            "conditions.all.1.all.0.attribute": "message.content",
            "conditions.all.1.all.0.operator": "contains",
            "conditions.all.1.all.0.value": "price",
            "conditions.all.1.all.0.type": "text",
            "conditions.all.1.all.1.attribute": "custom",
            "conditions.all.1.all.1.custom_key": "score",
            "conditions.all.1.all.1.operator": "is_greater_than",
            "conditions.all.1.all.1.value": "80",
            "conditions.all.1.all.1.type": "number",
            "conditions.all.1.all.2.attribute": "contact.tags",
            "conditions.all.1.all.2.operator": "in",
            "conditions.all.1.all.2.value": "vip, lead",
            "conditions.all.1.all.2.type": "text",
            "conditions.all.1.all.3.attribute": "conversation.status",
            "conditions.all.1.all.3.operator": "attribute_changed",
            "conditions.all.1.all.3.from": "open",
            "conditions.all.1.all.3.value": "pending",
            "conditions.all.1.all.3.type": "text",
            "conditions.all.1.all.4.attribute": "contact.opted_out",
            "conditions.all.1.all.4.operator": "is_present",
        },
    )
    with runtime.pool.connection() as conn:
        rule = rules.get_rule(conn, project.id, uuid.UUID(rule_id))
    assert rule.conditions == {
        "all": [
            {"attribute": "message.type", "operator": "equal_to", "value": "incoming"},
            {
                "any": [
                    {"attribute": "message.content", "operator": "contains", "value": "price"},
                    {"attribute": "contact.attributes.score", "operator": "is_greater_than", "value": 80},
                    {"attribute": "contact.tags", "operator": "in", "value": ["vip", "lead"]},
                    {
                        "attribute": "conversation.status",
                        "operator": "attribute_changed",
                        "value": {"from": "open", "to": "pending"},
                    },
                    {"attribute": "contact.opted_out", "operator": "is_present"},
                ]
            },
        ]
    }
    # the edit form draws the same tree, and saving it unchanged keeps it
    edit = client.get(f"/app/rules/{rule_id}/edit").text
    assert 'name="conditions.all.1.any.1.custom_key" value="score"' in edit
    summary = client.get("/app/rules").text
    assert "message.type equal to" in summary and " or " in summary


def test_rules_actions_enable_disable_delete(signed_in, runtime) -> None:
    client, token = signed_in
    rule_id = create_rule_via_form(
        client,
        token,
        name="r",
        event="contact.created",
        execute="immediately",
        **{"actions.0.type": "add_contact_tag", "actions.0.tags": "new"},
    )
    add = client.post(
        f"/app/rules/{rule_id}/edit",
        data={
            "_csrf": token,
            "name": "r",
            "event": "contact.created",
            "actions.0.type": "add_contact_tag",
            "actions.0.tags": "new",
            "new_action_type": "send_webhook",
            "_op": "add_action",
        },
    )
    assert 'name="actions.1.url"' in add.text
    assert client.post(f"/app/rules/{rule_id}/disable", data={"_csrf": token}).status_code == 200
    assert rows(runtime.pool, "SELECT active FROM rules") == [(False,)]
    assert client.post(f"/app/rules/{rule_id}/enable", data={"_csrf": token}).status_code == 200
    assert rows(runtime.pool, "SELECT active FROM rules") == [(True,)]
    assert "Deleted." in client.post(f"/app/rules/{rule_id}/delete", data={"_csrf": token}).text
    assert rows(runtime.pool, "SELECT count(*) FROM rules") == [(0,)]


def test_a_rules_executions_pending_executed_and_skipped_with_reasons(
    signed_in, project, runtime, clock
) -> None:
    client, token = signed_in
    rule_id = create_rule_via_form(
        client,
        token,
        name="welcome later",
        event="contact.created",
        execute="delayed",
        delay_value="1",
        delay_unit="hours",
        **{"actions.0.type": "add_contact_tag", "actions.0.tags": "welcomed"},
    )
    for phone in ("+14155550001", "+14155550002"):
        api(client, project, "POST", "/v1/contacts", json={"phone": phone})
    process(runtime)
    page = client.get(f"/app/rules/{rule_id}?status=pending").text
    assert page.count('status-pending">pending') == 2
    # one runs, then the rule is disabled and the other is skipped when it falls due
    clock.advance(timedelta(minutes=61))
    executions.sweep(runtime.pool, clock, stale_after=timedelta(days=1), limit=1)
    client.post(f"/app/rules/{rule_id}/disable", data={"_csrf": token})
    executions.sweep(runtime.pool, clock, stale_after=timedelta(days=1))
    page = client.get(f"/app/rules/{rule_id}").text
    assert 'status-executed">executed' in page
    assert 'status-skipped">skipped' in page and "rule_inactive" in page
    assert "No pending executions." in client.get(f"/app/rules/{rule_id}?status=pending").text


# --- sequences ----------------------------------------------------------------------------------------------


def make_sequence_via_form(client: TestClient[Any], token: str, name: str) -> str:
    response = client.post("/app/sequences/new", data={"_csrf": token, "name": name}, follow_redirects=False)
    assert response.status_code == 303, errors_on(response.text)
    return response.headers["location"].split("/")[3].split("?")[0]


def add_step(client: TestClient[Any], token: str, sequence_id: str, **fields: str) -> TestClient[Any]:
    data = {
        "_csrf": token,
        "kind": "message",
        "timing": "wait",
        "wait_value": "0",
        "wait_unit": "hours",
        "_op": "save",
    } | fields
    response = client.post(f"/app/sequences/{sequence_id}/steps/new", data=data, follow_redirects=False)
    assert response.status_code == 303, errors_on(response.text)
    return client


def publish(client: TestClient[Any], token: str, sequence_id: str) -> None:
    response = client.post(
        f"/app/sequences/{sequence_id}/publish", data={"_csrf": token}, follow_redirects=False
    )
    assert response.status_code == 303, errors_on(response.text)


def draft_of(runtime: Runtime, sequence_id: str) -> dict[str, Any]:
    draft: dict[str, Any] = rows(
        runtime.pool, "SELECT draft FROM followup_sequences WHERE id = %s", sequence_id
    )[0][0]
    return draft


def test_the_builder_adds_edits_reorders_and_removes_steps(signed_in, runtime) -> None:
    client, token = signed_in
    sequence_id = make_sequence_via_form(client, token, "Onboarding")
    add_step(client, token, sequence_id, text="Hi {{contact.name}}")
    add_step(
        client,
        token,
        sequence_id,
        text="Any questions?",
        wait_value="2",
        wait_unit="days",
        only_if="no_reply_since_previous_step",
    )
    add_step(
        client,
        token,
        sequence_id,
        timing="anchor",
        text="See you at {{anchor.time}}",
        offset_value="2",
        offset_unit="hours",
        offset_direction="before",
        grace_value="30",
        grace_unit="minutes",
        window="on",
        **{"send_window.start": "09:00", "send_window.end": "18:00", "send_window.days": "mon"},
    )
    add_step(
        client,
        token,
        sequence_id,
        kind="ai",
        instructions="Ask politely",
        goal="help",
        **{"fallback.kind": "skip", "min_confidence": "0.7"},
    )
    # changing the kind draws the form again for the new kind, and saves nothing
    redrawn = client.post(
        f"/app/sequences/{sequence_id}/steps/new",
        data={"_csrf": token, "kind": "ai", "text": "kept?", "timing": "wait", "_op": "refresh"},
    )
    assert redrawn.status_code == 200 and 'name="instructions"' in redrawn.text
    steps = draft_of(runtime, sequence_id)["steps"]
    assert [s["kind"] for s in steps] == ["message", "message", "message", "ai"]
    assert steps[1]["delay_seconds"] == 172800 and steps[1]["only_if"] == ["no_reply_since_previous_step"]
    assert steps[2]["anchor_offset_seconds"] == -7200 and steps[2]["grace_seconds"] == 1800
    assert steps[2]["send_window"] == {"start": "09:00", "end": "18:00", "days": ["mon"]}
    assert steps[3]["fallback"] == {"kind": "skip"} and steps[3]["min_confidence"] == 0.7
    builder = client.get(f"/app/sequences/{sequence_id}").text
    assert "Wait 2d after the previous step" in builder and "2h before the anchor" in builder
    # edit the first step: its form shows what is stored
    edit = client.get(f"/app/sequences/{sequence_id}/steps/0").text
    assert "Hi {{contact.name}}</textarea>" in edit
    response = client.post(
        f"/app/sequences/{sequence_id}/steps/0",
        data={
            "_csrf": token,
            "kind": "message",
            "text": "Hello!",
            "timing": "wait",
            "wait_value": "5",
            "wait_unit": "minutes",
            "_op": "save",
        },
        follow_redirects=False,
    )
    assert response.status_code == 303
    assert draft_of(runtime, sequence_id)["steps"][0]["text"] == "Hello!"
    assert draft_of(runtime, sequence_id)["steps"][0]["delay_seconds"] == 300
    # reorder and remove
    client.post(f"/app/sequences/{sequence_id}/steps/3/move", data={"_csrf": token, "direction": "up"})
    assert [s["kind"] for s in draft_of(runtime, sequence_id)["steps"]] == [
        "message",
        "message",
        "ai",
        "message",
    ]
    client.post(f"/app/sequences/{sequence_id}/steps/0/move", data={"_csrf": token, "direction": "down"})
    assert draft_of(runtime, sequence_id)["steps"][1]["text"] == "Hello!"
    client.post(f"/app/sequences/{sequence_id}/steps/2/remove", data={"_csrf": token})
    assert [s["kind"] for s in draft_of(runtime, sequence_id)["steps"]] == ["message", "message", "message"]
    assert (
        client.post(f"/app/sequences/{sequence_id}/steps/7/remove", data={"_csrf": token}).status_code == 404
    )
    assert (
        client.post(
            f"/app/sequences/{sequence_id}/steps/0/move", data={"_csrf": token, "direction": "up"}
        ).status_code
        == 404
    )


@pytest.mark.parametrize(
    ("fields", "name", "message"),
    [
        ({"text": "  "}, "text", "text must not be empty"),
        ({"text": "Hi {{vars.x"}, "text", "unclosed placeholder"),
        ({"text": "Hi {{name}}"}, "text", ""),
        ({"wait_value": "-1"}, "delay_seconds", ">= 0"),
        ({"wait_value": "soon"}, "delay_seconds", "whole number"),
        ({"only_if": "no_reply_since_previous_step"}, "only_if", "the first step has no previous step"),
        (
            {
                "window": "on",
                "send_window.start": "25:00",
                "send_window.end": "10:00",
                "send_window.days": "mon",
            },
            "send_window.start",
            "24-hour time",
        ),
        ({"media_url": "ftp://x", "media_kind": "image"}, "media_url", "http or https"),
        ({"whatsapp_template.name": "Bad Name"}, "whatsapp_template.name", "lowercase"),
        ({"kind": "ai", "instructions": "x", "min_confidence": "2"}, "min_confidence", "<= 1"),
        ({"timing": "anchor", "offset_value": ""}, "anchor_offset_seconds", "required"),
    ],
)
def test_step_errors_are_shown_next_to_their_field(signed_in, runtime, fields, name, message) -> None:
    client, token = signed_in
    sequence_id = make_sequence_via_form(client, token, "S")
    data = {
        "_csrf": token,
        "kind": "message",
        "text": "ok",
        "timing": "wait",
        "wait_value": "0",
        "wait_unit": "hours",
        "_op": "save",
    } | fields
    response = client.post(f"/app/sequences/{sequence_id}/steps/new", data=data)
    assert response.status_code == 422
    assert message in field_error(response.text, name)
    assert draft_of(runtime, sequence_id).get("steps", []) == []


def test_publish_creates_versions_and_its_errors_name_the_step(signed_in, runtime) -> None:
    client, token = signed_in
    sequence_id = make_sequence_via_form(client, token, "S")
    refused = client.post(f"/app/sequences/{sequence_id}/publish", data={"_csrf": token})
    assert refused.status_code == 422
    assert "a sequence needs at least one step" in refused.text
    add_step(client, token, sequence_id, text="One")
    add_step(client, token, sequence_id, text="Two", only_if="no_reply_since_previous_step")
    publish(client, token, sequence_id)
    assert "Published version v1" in client.get(f"/app/sequences/{sequence_id}").text
    # moving the second step first makes its only-if impossible: publishing says so on that step
    client.post(f"/app/sequences/{sequence_id}/steps/1/move", data={"_csrf": token, "direction": "up"})
    refused = client.post(f"/app/sequences/{sequence_id}/publish", data={"_csrf": token})
    assert refused.status_code == 422
    first_step = refused.text.split('id="f-definition-steps-0"')[1].split("</li>")[0]
    assert "the first step has no previous step" in first_step and 'class="invalid"' in refused.text
    client.post(f"/app/sequences/{sequence_id}/steps/0/move", data={"_csrf": token, "direction": "down"})
    client.post(
        f"/app/sequences/{sequence_id}/steps/1",
        data={
            "_csrf": token,
            "kind": "message",
            "text": "Two, changed",
            "timing": "wait",
            "wait_value": "1",
            "wait_unit": "days",
            "_op": "save",
        },
    )
    publish(client, token, sequence_id)
    assert rows(runtime.pool, "SELECT version FROM followup_sequence_versions ORDER BY version") == [
        (1,),
        (2,),
    ]
    versions = client.get(f"/app/sequences/{sequence_id}/versions").text
    assert "v2" in versions and "(current)" in versions
    changes = client.get(f"/app/sequences/{sequence_id}/versions?from=1&to=2").text
    assert "step 2 · text" in changes and "<del>Two</del>" in changes and "<ins>Two, changed</ins>" in changes
    assert "step 2 · delay seconds" in changes and "<ins>86400</ins>" in changes
    assert "step 2 · only if" in changes


def test_pause_resume_archive(signed_in, runtime) -> None:
    client, token = signed_in
    sequence_id = make_sequence_via_form(client, token, "S")
    conflict = client.post(f"/app/sequences/{sequence_id}/pause", data={"_csrf": token})
    assert conflict.status_code == 409 and "a draft sequence cannot be paused" in conflict.text
    add_step(client, token, sequence_id, text="One")
    publish(client, token, sequence_id)
    for action, status in (("pause", "paused"), ("resume", "active"), ("archive", "archived")):
        response = client.post(f"/app/sequences/{sequence_id}/{action}", data={"_csrf": token})
        assert response.status_code == 200
        assert rows(runtime.pool, "SELECT status FROM followup_sequences") == [(status,)]
    archived = client.get(f"/app/sequences/{sequence_id}").text
    assert "Add message" not in archived and "/publish" not in archived
    assert "archived" in client.get("/app/sequences?status=archived").text


def test_sequence_options_and_rename(signed_in, runtime) -> None:
    client, token = signed_in
    sequence_id = make_sequence_via_form(client, token, "S")

    def options(end: str = "12:00", days: Any = ("mon", "tue"), **more: str) -> Any:
        """POST the options form: re-entry never, stop on reply, a send window 08:00 to ``end``."""
        fields = {
            "_csrf": token,
            "definition.reentry": "never",
            "definition.stop_on.reply": "on",
            "window": "on",
            "definition.send_window.start": "08:00",
            "definition.send_window.end": end,
            "definition.send_window.days": list(days) if not isinstance(days, str) else days,
        }
        return client.post(
            f"/app/sequences/{sequence_id}/options", data=fields | more, follow_redirects=False
        )

    response = options(end="08:00", days="mon")
    assert response.status_code == 422
    assert "start and end must differ" in response.text
    response = options(**{"definition.number_id": str(uuid.uuid4())})
    assert response.status_code == 404
    assert field_error(response.text, "definition.number_id") == "number not found"
    response = options()
    assert response.status_code == 303
    draft = draft_of(runtime, sequence_id)
    assert draft["reentry"] == "never"
    assert draft["stop_on"] == {
        "reply": True,
        "human_message": False,
        "opt_out": False,
        "lead_closed": False,
        "conversation_resolved": False,
    }
    assert draft["send_window"] == {"start": "08:00", "end": "12:00", "days": ["mon", "tue"]}
    renamed = client.post(f"/app/sequences/{sequence_id}/rename", data={"_csrf": token, "name": ""})
    assert renamed.status_code == 422 and "1 to 200 characters" in field_error(renamed.text, "name")
    client.post(f"/app/sequences/{sequence_id}/rename", data={"_csrf": token, "name": "Renamed"})
    assert rows(runtime.pool, "SELECT name FROM followup_sequences") == [("Renamed",)]


def test_the_step_preview_renders_for_a_contact_and_says_when_it_would_be_skipped(
    signed_in, project, pool
) -> None:
    client, token = signed_in
    contact_id = make_contact(pool, project.id, name="Ada", attributes={"plan": "gold"})
    nameless = make_contact(pool, project.id)
    sequence_id = make_sequence_via_form(client, token, "S")
    data = {
        "_csrf": token,
        "kind": "message",
        "timing": "wait",
        "wait_value": "0",
        "wait_unit": "hours",
        "text": "Hi {{contact.name}}, your {{contact.attributes.plan}} plan, order {{vars.order}}",
        "preview_contact": str(contact_id),
        "preview_variables": "order=42",
        "_op": "preview",
    }
    shown = client.post(f"/app/sequences/{sequence_id}/steps/new", data=data)
    assert shown.status_code == 200
    assert '<p class="preview">Hi Ada, your gold plan, order 42</p>' in shown.text
    skipped = client.post(
        f"/app/sequences/{sequence_id}/steps/new", data=data | {"preview_contact": str(nameless)}
    )
    assert "This step would be skipped (missing_variable:contact.name)." in skipped.text
    no_vars = client.post(f"/app/sequences/{sequence_id}/steps/new", data=data | {"preview_variables": ""})
    assert "This step would be skipped (missing_variable:vars.order)." in no_vars.text
    anchor = client.post(
        f"/app/sequences/{sequence_id}/steps/new",
        data=data
        | {"text": "See you {{anchor.weekday}} at {{anchor.time}}", "preview_anchor": "2025-03-07T14:30"},
    )
    assert '<p class="preview">See you Friday at 14:30</p>' in anchor.text
    assert draft_of_steps(pool, sequence_id) == []  # previewing saves nothing


def draft_of_steps(pool: Any, sequence_id: str) -> list[Any]:
    return list(
        rows(pool, "SELECT draft FROM followup_sequences WHERE id = %s", sequence_id)[0][0].get("steps", [])
    )


# --- enrollments --------------------------------------------------------------------------------------------


def enroll(client: TestClient[Any], token: str, sequence_id: str, contact: str, **fields: str) -> str:
    response = client.post(
        "/app/enrollments/new",
        data={"_csrf": token, "sequence_id": sequence_id, "contact": contact, **fields},
        follow_redirects=False,
    )
    assert response.status_code == 303, errors_on(response.text)
    return response.headers["location"].split("/")[3].split("?")[0]


def test_enroll_one_contact_and_follow_its_timeline(signed_in, project, runtime, clock) -> None:
    client, token = signed_in
    make_contact(runtime.pool, project.id, phone="+14155550177", name="Ada")
    sequence_id = make_sequence_via_form(client, token, "S")
    add_step(client, token, sequence_id, text="Hi {{contact.name}}, {{vars.product}}?")
    add_step(client, token, sequence_id, text="Still there?", wait_value="1", wait_unit="days")
    publish(client, token, sequence_id)
    enrollment_id = enroll(
        client, token, sequence_id, "+1 415 555 0177", variables="product=boots", anchor_at="2030-01-01T10:00"
    )
    timeline = client.get(f"/app/enrollments/{enrollment_id}/timeline").text
    assert "Step 1 · message: next" in timeline and "Step 2 · message: later" in timeline
    assert "data-final" not in timeline
    # the release queues step 1: the timeline shows it with its message and the wait for step 2
    release_one(runtime.pool, clock, runtime.settings.followup)
    timeline = client.get(f"/app/enrollments/{enrollment_id}/timeline").text
    assert "Step 1 · message: queued" in timeline and "Hi Ada, boots?" in timeline
    assert 'status-QUEUED">QUEUED' in timeline and "Step 2 · message: next" in timeline
    detail = client.get(f"/app/enrollments/{enrollment_id}").text
    assert f'data-refresh="/app/enrollments/{enrollment_id}/timeline"' in detail
    assert "anchor 2030-01-01 10:00 UTC" in detail
    # pause, resume, stop with a note
    assert "Paused." in client.post(f"/app/enrollments/{enrollment_id}/pause", data={"_csrf": token}).text
    conflict = client.post(f"/app/enrollments/{enrollment_id}/pause", data={"_csrf": token})
    assert conflict.status_code == 409 and "the enrollment is paused" in conflict.text
    assert "Resumed." in client.post(f"/app/enrollments/{enrollment_id}/resume", data={"_csrf": token}).text
    too_long = client.post(f"/app/enrollments/{enrollment_id}/stop", data={"_csrf": token, "note": "n" * 501})
    assert too_long.status_code == 422 and "at most 500" in field_error(too_long.text, "note")
    stopped = client.post(
        f"/app/enrollments/{enrollment_id}/stop", data={"_csrf": token, "note": "asked by phone"}
    )
    assert (
        "Stopped." in stopped.text and "note: asked by phone" in stopped.text and "data-final" in stopped.text
    )
    assert rows(runtime.pool, "SELECT status, reason, note FROM followup_enrollments") == [
        ("stopped", "manual", "asked by phone")
    ]


def test_enrollment_errors_are_shown_next_to_their_field(signed_in, project, runtime) -> None:
    client, token = signed_in
    make_contact(runtime.pool, project.id, phone="+14155550178")
    sequence_id = make_sequence_via_form(client, token, "S")
    add_step(client, token, sequence_id, text="Hi")
    draft = client.post(
        "/app/enrollments/new", data={"_csrf": token, "sequence_id": sequence_id, "contact": "+14155550178"}
    )
    assert draft.status_code == 409 and "no published version" in field_error(draft.text, "sequence_id")
    publish(client, token, sequence_id)
    cases = [
        ({"contact": "+14155550999"}, "contact", "no contact has the phone number"),
        ({"contact": "nobody"}, "contact", "E.164"),
        ({"contact": ""}, "contact", "enter the contact"),
        ({"sequence_id": ""}, "sequence_id", "choose a sequence"),
        ({"variables": "no equals sign"}, "variables", "is not key=value"),
        ({"anchor_at": "tomorrow"}, "anchor_at", "date and time"),
    ]
    for fields, name, message in cases:
        data = {"_csrf": token, "sequence_id": sequence_id, "contact": "+14155550178"} | fields
        response = client.post("/app/enrollments/new", data=data)
        assert response.status_code in (404, 409, 422)
        assert message in field_error(response.text, name), (fields, errors_on(response.text))
    enroll(client, token, sequence_id, "+14155550178")
    again = client.post(
        "/app/enrollments/new", data={"_csrf": token, "sequence_id": sequence_id, "contact": "+14155550178"}
    )
    assert again.status_code == 409 and "already has a live enrollment" in field_error(again.text, "contact")


def test_the_enrollment_list_filters_by_sequence_status_and_contact(
    signed_in, project, runtime, clock
) -> None:
    client, token = signed_in
    first = make_sequence(runtime.pool, project.id)
    second = make_sequence(runtime.pool, project.id)
    ada = make_contact(runtime.pool, project.id, phone="+14155550181", name="Ada")
    bob = make_contact(runtime.pool, project.id, phone="+14155550182", name="Bob")
    make_enrollment(runtime.pool, clock, project.id, first, ada)
    make_enrollment(runtime.pool, clock, project.id, second, bob)
    paused = make_enrollment(runtime.pool, clock, project.id, second, ada)
    client.post(f"/app/enrollments/{paused.id}/pause", data={"_csrf": token})

    def listed(query: str) -> set[str]:
        page = client.get(f"/app/enrollments?{query}").text
        return set(re.findall(r'href="/app/enrollments/([0-9a-f-]{36})"', page))

    assert len(listed("")) == 3
    assert len(listed(f"sequence_id={second}")) == 2
    assert listed("status=paused") == {str(paused.id)}
    assert len(listed("contact=%2B14155550181")) == 2
    assert len(listed(f"contact={bob}&sequence_id={second}")) == 1
    missing = client.get("/app/enrollments?contact=%2B14155550999")
    assert "no contact has the phone number" in field_error(missing.text, "contact")
    assert (
        "No enrollments match." in client.get(f"/app/enrollments?status=completed&sequence_id={first}").text
    )


# --- settings -----------------------------------------------------------------------------------------------


def settings_form(token: str, **fields: Any) -> dict[str, Any]:
    return {
        "_csrf": token,
        "consent_mode": "off",
        "service_window": "off",
        "send_delay_ms": "0",
        "retention_days": "90",
    } | fields


def test_settings_change_the_send_window_and_the_caps(signed_in, project) -> None:
    client, token = signed_in
    response = client.post(
        "/app/settings",
        data=settings_form(
            token,
            **{
                "send_window.enabled": "on",
                "send_window.start": "09:00",
                "send_window.end": "17:30",
                "send_window.days": ["mon", "fri"],
                "consent_mode": "required",
                "max_per_contact_24h": "2",
                "send_delay_ms": "1500",
                "ai_monthly_token_budget": "100000",
            },
        ),
        follow_redirects=False,
    )
    assert response.status_code == 303
    stored = api(client, project, "GET", "/v1/settings")
    assert stored["send_window"] == {"start": "09:00", "end": "17:30", "days": ["mon", "fri"]}
    assert stored["consent_mode"] == "required" and stored["max_per_contact_24h"] == 2
    assert stored["send_delay_ms"] == 1500 and stored["ai_monthly_token_budget"] == 100000
    page = client.get("/app/settings").text
    assert 'name="send_window.start" value="09:00"' in page and 'value="fri" checked' in page
    assert "gpt-4o-mini" in page and "Tokens used this month: 0 of 100000" in page


@pytest.mark.parametrize(
    ("fields", "name", "message"),
    [
        (
            {
                "send_window.enabled": "on",
                "send_window.start": "25:00",
                "send_window.end": "10:00",
                "send_window.days": "mon",
            },
            "send_window.start",
            "24-hour time",
        ),
        (
            {"send_window.enabled": "on", "send_window.start": "09:00", "send_window.end": "10:00"},
            "send_window.days",
            "at least one day",
        ),
        ({"send_delay_ms": "99999999"}, "send_delay_ms", "<= 3600000"),
        ({"max_per_contact_24h": "two"}, "max_per_contact_24h", "whole number"),
        ({"retention_days": "0"}, "retention_days", ">= 1"),
        (
            {
                "business_hours.enabled": "on",
                "business_hours.start": "9",
                "business_hours.end": "17:00",
                "business_hours.days": "mon",
            },
            "business_hours.start",
            "24-hour time",
        ),
    ],
)
def test_settings_errors_are_shown_next_to_their_field(signed_in, project, fields, name, message) -> None:
    client, token = signed_in
    response = client.post("/app/settings", data=settings_form(token, **fields))
    assert response.status_code == 422
    assert message in field_error(response.text, name)
    assert api(client, project, "GET", "/v1/settings")["send_window"] is None


def test_settings_list_the_numbers_and_their_status(signed_in, project) -> None:
    client, _ = signed_in
    api(
        client,
        project,
        "POST",
        "/v1/numbers",
        json={"phone": "+14155550300", "name": "Sales", "is_default": True},
    )
    api(client, project, "POST", "/v1/numbers", json={"phone": "+14155550301", "status": "disconnected"})
    page = client.get("/app/settings").text
    assert "+14155550300" in page and 'status-connected">connected' in page
    assert 'status-disconnected">disconnected' in page


# --- results ------------------------------------------------------------------------------------------------


def test_results_per_sequence_and_step_with_svg_charts(signed_in, project, runtime, clock) -> None:
    client, _token = signed_in
    sequence_id = make_sequence(
        runtime.pool,
        project.id,
        MessageStep(text="Hi"),
        MessageStep(text="Hi {{vars.missing}}", delay_seconds=0),
    )
    for _n in range(3):
        contact = make_contact(runtime.pool, project.id)
        make_enrollment(runtime.pool, clock, project.id, sequence_id, contact)
    empty = client.get(f"/app/sequences/{sequence_id}/results").text
    assert 'Enrolled</div><div class="value">3' in empty
    for _ in range(6):
        release_one(runtime.pool, clock, runtime.settings.followup)
    page = client.get(f"/app/sequences/{sequence_id}/results").text
    assert '<svg class="chart" role="img"' in page and page.count("<svg") == 2
    assert "Step 1 queued: 3" in page  # the funnel's description
    assert "<code>missing_variable:vars.missing</code>: 3" in page
    assert 'Completed</div><div class="value">3' in page
    today = f'<td>{clock.now().date()}</td><td class="num">3</td><td class="num">3</td><td class="num">3</td>'
    assert today in page


def test_sequence_counts_and_daily_activity(project, runtime, clock) -> None:
    sequence_id = make_sequence(runtime.pool, project.id)
    other = make_sequence(runtime.pool, project.id)
    for _ in range(2):
        make_enrollment(runtime.pool, clock, project.id, sequence_id, make_contact(runtime.pool, project.id))
    clock.advance(timedelta(days=1))
    release_one(runtime.pool, clock, runtime.settings.followup)
    with runtime.pool.connection() as conn:
        counts = sequence_counts(conn, project.id, [sequence_id, other])
        days = daily_activity(conn, project.id, sequence_id, days=3, now=clock.now())
    assert counts[sequence_id].enrolled == 2 and counts[sequence_id].completed == 1
    assert counts[sequence_id].active == 1 and counts[other].enrolled == 0
    assert [d.day for d in days][-1] == clock.now().date() and len(days) == 3
    assert [(d.enrolled, d.queued, d.completed) for d in days] == [(0, 0, 0), (2, 0, 0), (0, 1, 1)]


# --- contact card -------------------------------------------------------------------------------------------


def test_the_contact_card_shows_live_follow_ups_pending_rules_and_opt_out(
    signed_in, project, runtime, clock
) -> None:
    client, token = signed_in
    create_rule_via_form(
        client,
        token,
        name="later",
        event="contact.created",
        execute="delayed",
        delay_value="3",
        delay_unit="hours",
        **{"actions.0.type": "add_contact_tag", "actions.0.tags": "x"},
    )
    created = client.post(
        "/app/contacts/new",
        data={
            "_csrf": token,
            "phone": "+14155550190",
            "name": "Ada",
            "timezone": "Europe/Lisbon",
            "tags": "vip, lead",
        },
        follow_redirects=False,
    )
    assert created.status_code == 303
    contact_id = created.headers["location"].split("/")[3].split("?")[0]
    process(runtime)
    sequence_id = make_sequence(runtime.pool, project.id)
    enrollment = make_enrollment(runtime.pool, clock, project.id, sequence_id, uuid.UUID(contact_id))
    card = client.get(f"/app/contacts/{contact_id}").text
    assert "Not opted out" in card and "<dt>Consent</dt><dd>unknown</dd>" in card and "lead, vip" in card
    assert f'href="/app/enrollments/{enrollment.id}"' in card
    assert 'status-pending">pending' in card and "later" in card
    # cancel the pending rule execution from the card: back on the card, none pending, and it is skipped
    pending = api(client, project, "GET", "/v1/rules")["items"][0]["id"]
    [execution] = api(client, project, "GET", f"/v1/rules/{pending}/executions")["items"]
    cancel = f"/app/rules/{pending}/executions/{execution['id']}/cancel"
    assert f'action="{cancel}"' in card
    cancelled = client.post(
        cancel, data={"_csrf": token, "back": f"/app/contacts/{contact_id}"}, follow_redirects=False
    )
    assert cancelled.headers["location"] == f"/app/contacts/{contact_id}?notice=cancelled"
    assert "No rule executions pending for this contact." in client.get(f"/app/contacts/{contact_id}").text
    [after] = api(client, project, "GET", f"/v1/rules/{pending}/executions")["items"]
    assert (after["status"], after["skip_reason"]) == ("skipped", "cancelled")
    # stop from the card: back on the card, nothing live
    stopped = client.post(
        f"/app/enrollments/{enrollment.id}/stop",
        data={"_csrf": token, "note": "from the card", "back": f"/app/contacts/{contact_id}"},
        follow_redirects=False,
    )
    assert stopped.headers["location"] == f"/app/contacts/{contact_id}?notice=stopped"
    assert "No live follow-ups for this contact." in client.get(f"/app/contacts/{contact_id}").text
    api(client, project, "POST", "/v1/events", json={"type": "contact.opted_out", "contact_id": contact_id})
    assert "Opted out</strong> since" in client.get(f"/app/contacts/{contact_id}").text
    # a refused new contact shows its errors next to the fields
    taken = client.post("/app/contacts/new", data={"_csrf": token, "phone": "+14155550190"})
    assert taken.status_code == 409 and field_error(taken.text, "phone")
    bad = client.post("/app/contacts/new", data={"_csrf": token, "phone": "12", "timezone": "Mars/Base"})
    assert bad.status_code == 422 and "E.164" in field_error(bad.text, "phone")


# --- bulk ---------------------------------------------------------------------------------------------------


def bulk_upload(client: TestClient[Any], token: str, sequence_id: str, csv_text: str, **fields: str) -> str:
    response = client.post(
        "/app/bulk/new",
        data={"_csrf": token, "sequence_id": sequence_id, **fields},
        files={"file": ("contacts.csv", csv_text.encode(), "text/csv")},
        follow_redirects=False,
    )
    assert response.status_code == 303, errors_on(response.text)
    return response.headers["location"].split("/")[3].split("?")[0]


def test_bulk_enrollment_from_a_csv_with_its_progress(signed_in, project, runtime, clock) -> None:
    client, token = signed_in
    sequence_id = make_sequence(runtime.pool, project.id)
    known = [make_contact(runtime.pool, project.id, phone=f"+1415555040{i}") for i in range(3)]
    csv_text = "name,phone\nA,+14155550400\nB,+14155550401\nC,+14155550499\n,\n"
    job_id = bulk_upload(client, token, str(sequence_id), csv_text)
    page = client.get(f"/app/bulk/{job_id}").text
    assert f'data-refresh="/app/bulk/{job_id}/progress"' in page and '<progress id="bulk-progress"' in page
    process_chunk(runtime.pool, clock)
    progress = client.get(f"/app/bulk/{job_id}/progress").text
    assert "data-final" in progress and "3 of 3 contacts processed" in progress and "2 enrolled" in progress
    assert "<code>unknown_contact</code>: 1" in progress
    skipped = client.get(f"/app/bulk/{job_id}/skipped.csv")
    assert skipped.headers["content-type"].startswith("text/csv") and "unknown_contact" in skipped.text
    # contact ids in the first column, without a header
    job2 = bulk_upload(client, token, str(sequence_id), f"{known[2]}\n")
    process_chunk(runtime.pool, clock)
    assert "1 enrolled" in client.get(f"/app/bulk/{job2}/progress").text


@pytest.mark.parametrize(
    ("csv_text", "message"),
    [("", "choose a CSV file"), ("phone\n", "no contacts"), (b"\xff\xfe\x00", "not UTF-8")],
)
def test_bulk_upload_errors_are_shown_next_to_the_file(
    signed_in, project, runtime, csv_text, message
) -> None:
    client, token = signed_in
    sequence_id = make_sequence(runtime.pool, project.id)
    files = {"file": ("c.csv", csv_text if isinstance(csv_text, bytes) else csv_text.encode(), "text/csv")}
    if csv_text == "":
        files = {"file": ("", b"", "application/octet-stream")}
    response = client.post(
        "/app/bulk/new", data={"_csrf": token, "sequence_id": str(sequence_id)}, files=files
    )
    assert response.status_code == 422
    assert message in field_error(response.text, "file")
    draft = make_sequence_via_form(client, token, "Draft")
    refused = client.post(
        "/app/bulk/new",
        data={"_csrf": token, "sequence_id": draft},
        files={"file": ("c.csv", b"+14155550400\n", "text/csv")},
    )
    assert refused.status_code == 422 and "published and active" in field_error(refused.text, "sequence_id")
