"""The dashboard end to end in a real browser: Playwright driving Debian's Chromium (``/usr/bin/chromium``,
packages ``chromium`` and ``chromium-driver``; no browser is downloaded).

Like the RabbitMQ tests: skipped locally when no Chromium is installed, a failure when ``CI`` is set. The
app runs under uvicorn on a free port in a thread, over the test's runtime (its database and clock); one
browser serves the whole session, each test gets a context (cookies) of its own. The tests write the
screenshots of ``docs/screenshots/`` (see docs/dashboard.md), so they show the pages as they are. The last
ones load every page at 390 px (``tests/browser_pages.py`` finds them from the routes) and ``/schema``, the
API's reference, with every request beyond this machine refused.
"""

from __future__ import annotations

import os
import re
import socket
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import uvicorn

from libs.common.core.clock import ManualClock
from libs.common.core.runtime import Runtime
from libs.common.followups.definition import MessageStep
from libs.common.rules import executions
from services.api.app import create_app
from services.release.release import release_one
from tests.browser_pages import NOT_PAGES, dashboard_pages, seed_every_kind
from tests.conftest import Project
from tests.factories import make_contact, make_enrollment, make_sequence
from tests.helpers import rows, wait_until
from tests.rule_helpers import process
from tests.test_sequence_results import GOALS, STEPS, finish, settle

CHROMIUM = "/usr/bin/chromium"
SCREENSHOTS = Path(__file__).resolve().parent.parent / "docs" / "screenshots"
DESKTOP: ViewportSize = {"width": 1280, "height": 800}
PHONE: ViewportSize = {"width": 390, "height": 844}
#: How long an expectation waits for the page (the timeline refreshes every 2 s).
TIMEOUT_MS = 15_000

try:
    from playwright.sync_api import (
        Browser,
        ConsoleMessage,
        Page,
        Route,
        ViewportSize,
        expect,
        sync_playwright,
    )
except ImportError:  # the dev extra installs it; only a partial local install lacks it
    if os.environ.get("CI"):
        raise
    pytest.skip("playwright is not installed (pip install -e '.[dev]')", allow_module_level=True)

expect.set_options(timeout=TIMEOUT_MS)


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    """Chromium, shared by the session's tests (skipped without it, a failure under CI)."""
    if not os.path.exists(CHROMIUM):
        message = f"no Chromium at {CHROMIUM} (apt-get install chromium chromium-driver)"
        if os.environ.get("CI"):
            pytest.fail(message + " and CI is set")
        pytest.skip(message)
    playwright = sync_playwright().start()
    try:
        chromium = playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"]
        )
        yield chromium
        chromium.close()
    finally:
        playwright.stop()


@pytest.fixture
def server(runtime: Runtime) -> Iterator[str]:
    """The API (and so the dashboard) over ``runtime``, served by uvicorn on a free port; its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(create_app(runtime), log_config=None, lifespan="on", access_log=False)
    uvicorn_server = uvicorn.Server(config)
    thread = threading.Thread(target=uvicorn_server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_until(lambda: uvicorn_server.started, what="uvicorn started")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        uvicorn_server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@pytest.fixture
def page(browser: Browser, server: str) -> Iterator[Page]:
    context = browser.new_context(viewport=DESKTOP, base_url=server)
    context.set_default_timeout(TIMEOUT_MS)
    tab = context.new_page()
    errors: list[str] = []

    def console(message: ConsoleMessage) -> None:
        if message.type == "error" and not _refused(message.text):
            errors.append(message.text)

    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    tab.on("console", console)
    yield tab
    context.close()
    assert not errors, f"the page logged errors: {errors}"  # a CSP refusal, a script error


def _refused(text: str) -> bool:
    """Chromium logs a page answered 401, 409 or 422 (a refused form, drawn again) as a failed load."""
    return bool(re.match(r"Failed to load resource: .* status of (401|409|422) ", text))


def screenshot(tab: Page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    tab.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def sign_in(tab: Page, project: Project) -> None:
    tab.goto("/app/")
    expect(tab).to_have_url(re.compile(r".*/app/sign-in\?next=/app/?$"))
    screenshot(tab, "sign-in")
    tab.get_by_label("API key").fill(project.api_key)
    tab.get_by_role("button", name="Sign in").click()
    expect(tab.get_by_role("heading", name="Sequences", exact=True)).to_be_visible()


def test_build_publish_enroll_and_watch_the_first_step_in_the_timeline(
    page: Page, project: Project, runtime: Runtime
) -> None:
    make_contact(runtime.pool, project.id, phone="+14155550100", name="Ada")
    sign_in(page, project)
    # Given a two-step sequence built in the builder and published
    page.get_by_label("Name").fill("Welcome")
    page.get_by_role("button", name="Create sequence").click()
    expect(page.get_by_text("No steps yet.")).to_be_visible()
    page.get_by_role("link", name="Add message").click()
    page.get_by_label("Message", exact=True).fill("Hi {{contact.name}}, welcome!")
    page.get_by_role("button", name="Save step").click()
    page.get_by_role("link", name="Add message").click()
    page.get_by_label("Message", exact=True).fill("Any questions, {{contact.name}}?")
    page.get_by_label("Wait", exact=True).fill("1")
    page.get_by_label("Unit").first.select_option("days")
    page.get_by_label("the contact has not replied since the previous step").check()
    page.get_by_role("button", name="Save step").click()
    expect(page.get_by_text("Wait 1d after the previous step")).to_be_visible()
    page.get_by_role("button", name="Publish").click()
    expect(page.get_by_role("status")).to_contain_text("Published")
    expect(page.get_by_text("Published version v1")).to_be_visible()
    screenshot(page, "sequence-builder")
    # When a contact is enrolled
    page.get_by_role("link", name="Enroll a contact").click()
    page.get_by_label("Contact (phone number or id)").fill("+14155550100")
    page.get_by_role("button", name="Enroll").click()
    timeline = page.locator("#timeline")
    expect(timeline).to_contain_text("Step 1 · message: next")
    # Then the release queues the first step, and the timeline shows it without a reload
    release_one(runtime.pool, runtime.clock, runtime.settings.followup)
    expect(timeline).to_contain_text("Step 1 · message: queued")
    expect(timeline).to_contain_text("Hi Ada, welcome!")
    expect(timeline).to_contain_text("Step 2 · message: next")
    screenshot(page, "enrollment-timeline")
    page.get_by_role("link", name="Sequences").click()
    expect(page.get_by_role("cell", name="1", exact=True).first).to_be_visible()
    screenshot(page, "sequences")
    page.get_by_role("link", name="Results of Welcome").click()
    expect(page.locator("svg.chart").first).to_be_visible()
    screenshot(page, "results")
    page.get_by_role("link", name="Contacts").click()
    page.get_by_role("link", name="Ada").click()
    expect(page.get_by_role("heading", name="Live follow-ups")).to_be_visible()
    screenshot(page, "contact-card")


def test_the_live_refresh_updates_the_header_and_buttons_when_the_enrollment_completes(
    page: Page, project: Project, runtime: Runtime
) -> None:
    # Given an active one-step enrollment's page, with Pause and Stop
    contact = make_contact(runtime.pool, project.id, phone="+14155550101", name="Bea")
    sequence_id = make_sequence(runtime.pool, project.id)
    enrollment = make_enrollment(runtime.pool, runtime.clock, project.id, sequence_id, contact)
    sign_in(page, project)
    page.goto(f"/app/enrollments/{enrollment.id}")
    heading = page.get_by_role("heading", level=1)
    expect(heading).to_contain_text("active")
    expect(page.get_by_role("button", name="Pause")).to_be_visible()
    # When its step is released, which completes it
    release_one(runtime.pool, runtime.clock, runtime.settings.followup)
    # Then, without a reload by hand, the header says completed and the buttons are gone
    expect(page.locator("#timeline")).to_contain_text("Completed")
    expect(heading).to_contain_text("completed")
    expect(page.get_by_role("button", name="Pause")).to_have_count(0)
    expect(page.get_by_role("button", name="Stop")).to_have_count(0)


def test_edit_tags_attributes_consent_and_opt_out_on_the_contact_card(
    page: Page, project: Project, runtime: Runtime
) -> None:
    # Given a contact with a live follow-up, and its card
    contact = make_contact(runtime.pool, project.id, phone="+14155550102", name="Cy")
    sequence_id = make_sequence(runtime.pool, project.id, MessageStep(text="Later", delay_seconds=3600))
    enrollment = make_enrollment(runtime.pool, runtime.clock, project.id, sequence_id, contact)
    sign_in(page, project)
    page.goto(f"/app/contacts/{contact}")
    saved = page.get_by_role("status")
    # When tags are added and one removed
    page.get_by_label("Add tags (comma-separated)").fill("vip, demo-booked")
    page.get_by_role("button", name="Add tags").click()
    expect(saved).to_contain_text("Saved.")
    page.locator(".tag", has_text="demo-booked").get_by_role("button", name="Remove").click()
    expect(page.locator(".tag", has_text="demo-booked")).to_have_count(0)
    # and attributes are set and one removed
    page.get_by_label("Set attributes (key=value, one a line)").fill("plan=pro\nscore=80\npaid=true")
    page.get_by_role("button", name="Set attributes").click()
    expect(page.locator("dd div", has_text="paid")).to_be_visible()
    page.locator("dd div", has_text="paid").get_by_role("button", name="Remove").click()
    expect(page.locator("dd div", has_text="paid")).to_have_count(0)
    # Then the API reads them back, typed
    read = page.request.get(f"/v1/contacts/{contact}", headers=project.headers).json()
    assert (read["tags"], read["attributes"]) == (["vip"], {"plan": "pro", "score": 80})
    # When consent is recorded
    page.get_by_role("button", name="Record consent").click()
    expect(page.get_by_role("button", name="Record consent")).to_have_count(0)
    assert page.request.get(f"/v1/contacts/{contact}", headers=project.headers).json()["consent"] == "granted"
    # and the contact is opted out there: its live follow-up stops, as the opt-out event stops it
    expect(page.get_by_role("link", name=re.compile("^seq "))).to_be_visible()
    page.get_by_role("button", name="Opt out").click()
    expect(page.get_by_text("Opted out", exact=True)).to_be_visible()
    expect(page.get_by_text("No live follow-ups for this contact.")).to_be_visible()
    assert rows(
        runtime.pool, "SELECT status, reason FROM followup_enrollments WHERE id = %s", enrollment.id
    ) == [("stopped", "opted_out")]
    read = page.request.get(f"/v1/contacts/{contact}", headers=project.headers).json()
    assert read["opted_out_at"] is not None and read["consent"] == "revoked"
    # and opted back in: consent is granted again
    page.get_by_role("button", name="Opt back in (consent granted)").click()
    expect(page.get_by_text("Not opted out")).to_be_visible()
    read = page.request.get(f"/v1/contacts/{contact}", headers=project.headers).json()
    assert (read["opted_out_at"], read["consent"]) == (None, "granted")


def test_relative_times_tick_on_a_page_that_does_not_refresh(
    page: Page, project: Project, runtime: Runtime
) -> None:
    # Given an enrollment whose step is due in 25 s (by the server's clock), on the enrollments list
    contact = make_contact(runtime.pool, project.id, phone="+14155550103", name="Di")
    sequence_id = make_sequence(runtime.pool, project.id, MessageStep(text="Soon", delay_seconds=25))
    make_enrollment(runtime.pool, runtime.clock, project.id, sequence_id, contact)
    sign_in(page, project)
    page.goto("/app/enrollments")
    due = page.locator("td time .relative").first
    first = re.fullmatch(r"\(in (2[0-5]) s\)", due.inner_text())
    assert first is not None, due.inner_text()
    page.evaluate("window.notReloaded = true")
    # Then, the page left alone, it counts down from the server's clock (not the browser's)
    expect(due).not_to_have_text(first.group(0))
    later = re.fullmatch(r"\(in (\d+) s\)", due.inner_text())
    assert later is not None and int(later.group(1)) < int(first.group(1)), due.inner_text()
    assert page.evaluate("window.notReloaded") is True


def test_create_a_delayed_rule_and_see_its_badge(page: Page, project: Project, runtime: Runtime) -> None:
    sign_in(page, project)
    page.get_by_role("link", name="Rules").click()
    expect(page.get_by_text("No rules yet.")).to_be_visible()
    page.get_by_role("link", name="Create the first rule").click()
    page.get_by_label("Name", exact=True).fill("Stale pending")
    page.get_by_label("Event").select_option("conversation.updated")
    page.get_by_label("After a delay:").check()
    page.get_by_label("Delay", exact=True).fill("4")
    page.get_by_label("Delay unit").select_option("hours")
    page.get_by_role("button", name="Add condition to conditions").click()
    page.get_by_label("Attribute", exact=True).select_option("conversation.status")
    page.get_by_label("Value", exact=True).fill("pending")
    page.get_by_label("Labels (comma separated)").fill("stale-pending")
    screenshot(page, "rule-form")
    page.get_by_role("button", name="Save rule").click()
    expect(page.get_by_role("status")).to_contain_text("Created.")
    page.get_by_role("link", name="Rules").click()
    badge = page.locator(".badge", has_text="runs after 4h")
    expect(badge).to_be_visible()
    screenshot(page, "rules")
    assert rows(runtime.pool, "SELECT execution_delay_minutes, conditions FROM rules") == [
        (240, {"all": [{"attribute": "conversation.status", "operator": "equal_to", "value": "pending"}]})
    ]


def test_test_a_rule_against_a_contact_and_see_why_it_matches(
    page: Page, project: Project, runtime: Runtime
) -> None:
    contact = make_contact(runtime.pool, project.id, phone="+14155550142", name="Ada", tags=["vip"])
    response = page.request.post(
        "/v1/rules",
        headers=project.headers,
        data={
            "name": "VIP nurture",
            "event": "contact.tag_added",
            "execution_delay_minutes": 90,
            "conditions": {
                "all": [
                    {"attribute": "event.tags_added", "operator": "contains", "value": "vip"},
                    {
                        "any": [
                            {"attribute": "contact.attributes.plan", "operator": "equal_to", "value": "gold"},
                            {"attribute": "contact.name", "operator": "starts_with", "value": "ad"},
                        ]
                    },
                ]
            },
            "actions": [{"type": "add_contact_tag", "tags": ["nurtured"]}],
        },
    )
    assert response.status == 201, response.text()
    sign_in(page, project)
    page.get_by_role("link", name="Rules").click()
    page.get_by_role("link", name="VIP nurture", exact=True).click()
    page.get_by_label("Contact (phone number or id)").fill("+14155550142")
    page.get_by_label("Event data (JSON, optional)").fill('{"tags_added": ["vip"]}')
    page.get_by_role("button", name="Test", exact=True).click()
    result = page.get_by_role("region", name="The rule matches")
    expect(result).to_be_visible()
    expect(result.locator("#tried-f-conditions-all-1-any-0")).to_contain_text("does not hold")
    expect(result.locator("#tried-f-conditions-all-1-any-0")).to_contain_text("absent")
    expect(result.locator("#tried-f-conditions-all-1-any-1")).to_contain_text('"Ada"')
    expect(result).to_contain_text("add contact tag: nurtured")
    expect(result).to_contain_text("Each event is an episode of its own")
    screenshot(page, "rule-test")
    assert rows(runtime.pool, "SELECT count(*) FROM followup_triggers") == [(0,)]
    assert rows(runtime.pool, "SELECT tags FROM contacts WHERE id = %s", contact) == [(["vip"],)]


def test_preview_a_sequence_for_a_contact_and_see_its_timeline(
    page: Page, project: Project, runtime: Runtime
) -> None:
    # the project's window is 09:00-17:00; at 04:00 in New York the first step waits for it
    nine_to_five = {"start": "09:00", "end": "17:00", "days": ["mon", "tue", "wed", "thu", "fri"]}
    assert page.request.put("/v1/settings", headers=project.headers, data={"send_window": nine_to_five}).ok
    make_contact(runtime.pool, project.id, phone="+14155550143", name="Ada", timezone="America/New_York")
    definition = {
        "steps": [
            {"kind": "message", "text": "Hi {{contact.name}}, welcome to the {{vars.plan}} plan"},
            {"kind": "message", "text": "Your code is {{vars.code}}", "delay_seconds": 3600},
            {"kind": "message", "text": "How is it going, {{contact.name}}?", "delay_seconds": 86400},
        ]
    }
    created = page.request.post(
        "/v1/sequences", headers=project.headers, data={"name": "Onboarding", "definition": definition}
    )
    assert created.status == 201, created.text()
    publish = page.request.post(f"/v1/sequences/{created.json()['id']}/publish", headers=project.headers)
    assert publish.status == 201, publish.text()
    sign_in(page, project)
    page.get_by_role("link", name="Onboarding", exact=True).click()
    page.get_by_role("link", name="Preview for a contact").click()
    page.get_by_label("Contact (phone number or id)").fill("+14155550143")
    page.get_by_label("Variables (key=value, one a line)").fill("plan=gold")
    page.get_by_role("button", name="Preview", exact=True).click()
    timeline = page.get_by_role("region", name="Timeline in America/New_York")
    expect(timeline).to_be_visible()
    steps = timeline.locator("li")
    expect(steps).to_have_count(3)
    expect(steps.nth(0)).to_contain_text("Tue 2030-01-01 09:00 local")
    expect(steps.nth(0)).to_contain_text("Outside the send window")
    expect(steps.nth(0)).to_contain_text("Hi Ada, welcome to the gold plan")
    expect(steps.nth(1)).to_contain_text("skipped")
    expect(steps.nth(1)).to_contain_text("vars.code")
    expect(steps.nth(2)).to_contain_text("Wed 2030-01-02 10:00 local")
    screenshot(page, "sequence-preview")
    assert rows(runtime.pool, "SELECT count(*) FROM followup_enrollments") == [(0,)]


def test_see_why_a_rule_ran_and_why_its_delayed_run_was_skipped_when_due(
    page: Page, project: Project, runtime: Runtime, clock: ManualClock
) -> None:
    # Given a delayed rule on a gold plan, run for a gold contact, whose plan changed before it fell due
    contact = make_contact(
        runtime.pool, project.id, phone="+14155550143", name="Ada", attributes={"plan": "gold"}
    )
    gold = {"attribute": "contact.attributes.plan", "operator": "equal_to", "value": "gold"}
    body = {
        "name": "Gold nurture",
        "event": "contact.tag_added",
        "execution_delay_minutes": 60,
        "conditions": {"all": [gold, {"attribute": "contact.tags", "operator": "contains", "value": "demo"}]},
        "actions": [{"type": "add_contact_tag", "tags": ["nurtured"]}],
    }
    assert page.request.post("/v1/rules", headers=project.headers, data=body).status == 201
    tagged = page.request.post(
        f"/v1/contacts/{contact}/tags", headers=project.headers, data={"tags": ["demo"]}
    )
    assert tagged.status == 200, tagged.text()
    process(runtime)
    changed = page.request.patch(
        f"/v1/contacts/{contact}", headers=project.headers, data={"attributes": {"plan": "silver"}}
    )
    assert changed.status == 200, changed.text()
    clock.advance(timedelta(minutes=61))
    executions.sweep(runtime.pool, clock, stale_after=timedelta(days=1))

    # When the rule's page is opened, Then its run reads "all 2 conditions held", and its page says why
    sign_in(page, project)
    page.get_by_role("link", name="Rules").click()
    page.get_by_role("link", name="Gold nurture", exact=True).click()
    expect(page.get_by_role("table", name="Recent runs")).to_contain_text("all 2 conditions held")
    page.get_by_role("table", name="Recent runs").get_by_role("link").first.click()
    ran = page.get_by_role("region", name="The conditions when it ran")
    expect(ran.locator("#run-f-conditions-all-0")).to_contain_text("holds")
    expect(ran.locator("#run-f-conditions-all-0")).to_contain_text('"gold"')
    due = page.get_by_role("region", name="When it fell due")
    expect(due).to_contain_text("skipped")
    expect(due.locator("#due-f-conditions-all-0")).to_contain_text("does not hold")
    expect(due.locator("#due-f-conditions-all-0")).to_contain_text('"silver"')
    screenshot(page, "rule-run")


def test_change_the_send_window_and_see_a_bad_input_next_to_its_field(
    page: Page, project: Project, runtime: Runtime
) -> None:
    sign_in(page, project)
    page.get_by_role("link", name="Settings").click()
    send_window = page.get_by_role("group", name="Send window", exact=True)
    send_window.get_by_label("Set", exact=True).check()
    send_window.get_by_label("From").fill("09:00")
    send_window.get_by_label("Until").fill("17:30")
    page.get_by_role("button", name="Save settings").click()
    expect(page.get_by_role("status")).to_contain_text("Saved.")
    assert rows(runtime.pool, "SELECT send_window FROM followup_settings") == [
        ({"start": "09:00", "end": "17:30", "days": ["mon", "tue", "wed", "thu", "fri"]},)
    ]
    screenshot(page, "settings")
    # a value the domain refuses: shown next to its field, and the summary takes the focus
    delay = page.get_by_label("Least gap between two follow-ups on one number (ms)")
    delay.fill("99999999")
    page.get_by_role("button", name="Save settings").click()
    error = page.locator("#f-send_delay_ms-error")
    expect(error).to_contain_text("from 0 to 3600000")
    expect(delay).to_have_attribute("aria-invalid", "true")
    expect(page.locator(".error-summary")).to_be_focused()
    screenshot(page, "settings-error")
    assert rows(runtime.pool, "SELECT send_delay_ms FROM followup_settings") == [(0,)]


def test_keyboard_and_a_phone_screen(page: Page, project: Project) -> None:
    sign_in(page, project)
    # a fresh load (goto waits for it) so the Tab below lands in the new document, not the old one
    page.goto("/app/rules")
    expect(page.get_by_role("link", name="Create the first rule")).to_be_visible()
    # the first Tab reaches the skip link, which moves the focus to the page's content
    page.keyboard.press("Tab")
    expect(page.get_by_role("link", name="Skip to content")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.locator("main")).to_be_focused()
    # the rule form is usable from the keyboard alone: Enter in the name field saves (and is refused)
    page.get_by_role("link", name="Create the first rule").focus()
    page.keyboard.press("Enter")
    page.get_by_label("Name").focus()
    page.keyboard.type("By keyboard")
    page.keyboard.press("Enter")
    expect(page.locator("#f-actions-0-labels-error")).to_contain_text("labels has 1 to 20 items")
    # at 390 x 844 nothing is wider than the screen
    page.set_viewport_size(PHONE)
    for path in ("/app/rules/new", "/app/sequences", "/app/settings", "/app/enrollments", "/app/api-keys"):
        page.goto(path)
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= PHONE["width"], (path, width)
    page.goto("/app/sequences")
    screenshot(page, "sequences-phone")


def test_revoking_the_key_signs_the_browser_out_at_its_next_page(page: Page, project: Project) -> None:
    # Given a browser signed in with a write key made for it
    admin = {"Authorization": f"Bearer {project.api_key}"}
    created = page.request.post("/v1/api-keys", data={"name": "laptop", "scope": "write"}, headers=admin)
    assert created.status == 201, created.text()
    key = created.json()
    sign_in(page, Project(project.id, key["api_key"]))
    page.get_by_role("link", name="Rules").first.click()
    expect(page.get_by_role("heading", name="Rules", exact=True)).to_be_visible()
    # When the key is revoked through the API
    revoked = page.request.post(f"/v1/api-keys/{key['key']['id']}/revoke", headers=admin)
    assert revoked.status == 200, revoked.text()
    # Then the next page the browser loads is the sign-in, and back there it is still signed out
    page.get_by_role("link", name="Sequences").first.click()
    expect(page).to_have_url(re.compile(r".*/app/sign-in\?next=/app/sequences$"))
    expect(page.get_by_label("API key")).to_be_visible()
    page.go_back()
    page.reload()
    expect(page).to_have_url(re.compile(r".*/app/sign-in\?next=/app/rules$"))


def test_create_a_key_see_it_once_and_revoke_it(page: Page, project: Project, runtime: Runtime) -> None:
    sign_in(page, project)
    page.get_by_role("link", name="API keys").click()
    page.get_by_label("Name (what it is for)").fill("send lane")
    page.get_by_label("Scope").select_option("events")
    page.get_by_role("button", name="Create key").click()
    shown = page.get_by_label("API key", exact=True)
    expect(shown).to_have_value(re.compile(r"^fu_"))
    key = shown.input_value()
    [(scope,)] = rows(runtime.pool, "SELECT scope FROM api_keys WHERE prefix = %s", key[:8])
    assert scope == "events"
    screenshot(page, "api-keys")
    page.get_by_role("button", name="Revoke send lane").click()
    expect(page.get_by_role("status")).to_contain_text("Revoked")
    expect(page.get_by_label("API key", exact=True)).to_have_count(0)  # shown once: not after that
    assert rows(runtime.pool, "SELECT revoked_at IS NOT NULL FROM api_keys WHERE prefix = %s", key[:8]) == [
        (True,)
    ]


# --- the step form: its preview beside the text on a desktop screen, right below it on a phone


def open_new_step(tab: Page) -> None:
    tab.get_by_label("Name").fill("Welcome")
    tab.get_by_role("button", name="Create sequence").click()
    tab.get_by_role("link", name="Add message").click()


def test_the_preview_is_beside_the_text_and_shows_the_rendered_step(
    page: Page, project: Project, runtime: Runtime
) -> None:
    make_contact(runtime.pool, project.id, phone="+14155550100", name="Ada")
    sign_in(page, project)
    open_new_step(page)
    # the first step is not offered a condition about a previous step
    expect(page.get_by_label("the contact has not replied since the previous step")).to_have_count(0)
    page.get_by_label("Message", exact=True).fill("Hi {{contact.name}}, your plan is {{vars.plan}}")
    page.get_by_label("Contact", exact=True).select_option(label="Ada")
    page.get_by_label("Enrollment variables (key=value, one a line)").fill("plan=gold")
    page.get_by_role("button", name="Preview").click()
    expect(page.locator("#preview")).to_contain_text("Hi Ada, your plan is gold")
    text = page.get_by_label("Message", exact=True).bounding_box()
    preview = page.locator("#step-preview").bounding_box()
    assert text is not None and preview is not None
    # beside the text: to its right, its top level with the text's (not 1,300 px below it)
    assert preview["x"] >= text["x"] + text["width"], (text, preview)
    assert preview["y"] < text["y"] + text["height"], (text, preview)
    screenshot(page, "step-form")
    # on a phone the preview follows the text at once
    page.set_viewport_size(PHONE)
    text = page.get_by_label("Message", exact=True).bounding_box()
    preview = page.locator("#step-preview").bounding_box()
    assert text is not None and preview is not None
    assert 0 <= preview["y"] - (text["y"] + text["height"]) < 300, (text, preview)


# --- every page at 390 px (docs/dashboard.md: no page scrolls sideways) -----------------------------------


def test_see_each_variant_and_choose_the_winner(
    page: Page,
    project: Project,
    runtime: Runtime,
    clock: ManualClock,
) -> None:
    api = page.request
    definition = {"steps": list(STEPS), "goals": GOALS}
    created = api.post(
        "/v1/sequences", headers=project.headers, data={"name": "Spring offer", "definition": definition}
    )
    assert created.status == 201, created.text()
    sequence_id = created.json()["id"]
    assert api.post(f"/v1/sequences/{sequence_id}/publish", headers=project.headers).status == 201
    # nine contacts taken down the branch, the split and the wait by the release; one of them converts
    enrollments = []
    for n in range(9):
        contact = {"phone": f"+1415555077{n}", "tags": ["vip"] if n < 3 else []}
        contact_id = api.post("/v1/contacts", headers=project.headers, data=contact).json()["id"]
        body = {"sequence_id": sequence_id, "contact_id": contact_id}
        enrollments.append(api.post("/v1/enrollments", headers=project.headers, data=body).json()["id"])
    settle(runtime, clock)
    clock.advance(timedelta(hours=2))
    settle(runtime, clock)
    finish(runtime.pool, enrollments[0], goal="won", converted_at=clock.now(), converted_step=0)
    stats = api.get(f"/v1/sequences/{sequence_id}/statistics", headers=project.headers).json()
    [offer] = stats["experiments"]
    # each enrollment counted once in its variant, as in the split's paths
    assert (
        sum(v["assigned"] for v in offer["variants"])
        == 9
        == sum(p["entered"] for p in stats["paths"] if p["kind"] == "split")
    )
    assert sum(v["converted"] for v in offer["variants"]) == 1

    sign_in(page, project)
    page.goto(f"/app/sequences/{sequence_id}/results")
    expect(page.get_by_role("heading", name="Paths")).to_be_visible()
    expect(
        page.get_by_role("img", name="Each path's enrollments, follow-ups, replies and conversions")
    ).to_be_visible()
    variants = page.get_by_role("table", name="The variants of offer")
    for variant in offer["variants"]:
        row = variants.locator(f'tr[data-variant="{variant["variant"]}"]')
        expect(row.locator('[data-count="assigned"]')).to_have_text(str(variant["assigned"]))
        if variant["conversion_interval"]:
            low, high = variant["conversion_interval"]
            expect(row.locator('[data-count="rate"]')).to_have_text(
                f"{variant['conversion_rate'] * 100:.1f} %"
            )
            expect(row.locator('[data-count="interval"]')).to_have_text(
                f"{low * 100:.1f} % to {high * 100:.1f} %"
            )
    expect(variants.locator('tr[data-variant="holdout"]').get_by_role("button")).to_have_count(0)
    screenshot(page, "sequence-experiment")
    row_a = variants.locator('tr[data-variant="a"]')
    row_a.get_by_role("button", name="Choose winner").click()
    expect(page.get_by_text("Winner chosen")).to_be_visible()
    expect(row_a.get_by_text("winner", exact=True)).to_be_visible()
    expect(row_a.get_by_role("button", name="Choose winner")).to_have_count(0)
    expect(
        variants.locator('tr[data-variant="b"]').get_by_role("button", name="Choose winner")
    ).to_be_visible()
    current = api.get(f"/v1/sequences/{sequence_id}", headers=project.headers).json()
    assert current["current_version"] == 2 and current["draft"]["steps"][2]["winner"] == "a"


def test_the_pages_are_found_from_the_routes() -> None:
    found = dashboard_pages()
    assert {"/app/sequences", "/app/rules", "/app/contacts/{contact_id}", "/app/settings"} <= set(found)
    assert not [path for path in found if NOT_PAGES.search(path)]


def test_no_page_is_wider_than_a_phone(page: Page, project: Project, runtime: Runtime) -> None:
    """Every page the dashboard serves, with data in it; a wide table may scroll in its own box, the page
    may not."""
    ids = seed_every_kind(page.request, project, runtime)
    sign_in(page, project)
    page.set_viewport_size(PHONE)
    wide = {}
    for template in dashboard_pages():
        path = re.sub(r"\{(\w+)\}", lambda m: ids[m.group(1)], template)
        response = page.goto(path)
        assert response is not None and response.ok, (path, response and response.status)
        width = page.evaluate("document.documentElement.scrollWidth")
        if width > PHONE["width"]:
            wide[path] = width
    assert not wide, f"pages wider than {PHONE['width']} px: {wide}"


# --- /schema offline: the API's reference from the product's own files (services/api/schema_assets) -----

LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}


def test_the_reference_loads_with_every_outside_request_blocked(page: Page) -> None:
    blocked: list[str] = []
    loaded: list[str] = []

    def only_loopback(route: Route) -> None:
        url = route.request.url
        if urlsplit(url).scheme in ("data", "blob") or urlsplit(url).hostname in LOOPBACK:
            loaded.append(url)
            route.continue_()
        else:
            blocked.append(url)
            route.abort()

    page.context.route("**/*", only_loopback)
    page.goto("/schema")
    expect(page.get_by_role("menuitem", name="system", exact=True)).to_be_visible()
    assert not blocked, f"/schema asked for outside resources: {blocked}"
    # the operations, by their tag and their path, as Redoc draws them
    expect(page.get_by_role("menuitem", name="contacts", exact=True)).to_be_visible()
    operation = page.locator("[data-section-id='operation/V1ContactsCreate']")
    expect(operation).to_contain_text("/v1/contacts")
    expect(page.locator("[data-section-id='operation/V1SequencesSequenceIdPublishPublish']")).to_be_attached()

    assert any(url.endswith("/schema/assets/redoc.standalone.js") for url in loaded), loaded


def test_the_assets_are_served_with_their_licence(page: Page) -> None:
    script = page.request.get("/schema/assets/redoc.standalone.js")
    assert script.status == 200
    assert "javascript" in script.headers["content-type"]
    licence = page.request.get("/schema/assets/LICENSE.redoc")
    assert licence.status == 200 and "MIT License" in licence.text()
    html = page.request.get("/schema").text()
    assert "https://" not in html.split("<body>", 1)[0], "the page's head loads something from outside"
