"""``/schema`` works offline: in Chromium with every request beyond this machine refused, the reference loads
from the product's own files (Redoc, services/api/schema_assets) and shows the operations.

The browser, the server and the page (which fails the test on a script error) are those of
tests/test_dashboard_browser.py.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from playwright.sync_api import Page, Route, expect

from tests.test_dashboard_browser import browser, page, server  # noqa: F401 (fixtures)

LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}


def test_the_reference_loads_with_every_outside_request_blocked(page: Page) -> None:  # noqa: F811
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


def test_the_assets_are_served_with_their_licence(page: Page) -> None:  # noqa: F811
    script = page.request.get("/schema/assets/redoc.standalone.js")
    assert script.status == 200
    assert "javascript" in script.headers["content-type"]
    licence = page.request.get("/schema/assets/LICENSE.redoc")
    assert licence.status == 200 and "MIT License" in licence.text()
    html = page.request.get("/schema").text()
    assert "https://" not in html.split("<body>", 1)[0], "the page's head loads something from outside"
