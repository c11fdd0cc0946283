"""The step form in a real browser: its preview is drawn beside the text on a desktop screen and right
below it on a phone (Chromium as in tests/test_dashboard_browser.py, whose fixtures these tests use)."""

from __future__ import annotations

from playwright.sync_api import Page, expect

from libs.common.core.runtime import Runtime
from tests.conftest import Project
from tests.factories import make_contact
from tests.test_dashboard_browser import PHONE, browser, page, screenshot, server, sign_in

__all__ = ["browser", "page", "server"]  # the fixtures, shared with tests/test_dashboard_browser.py


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
