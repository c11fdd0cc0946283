"""No dashboard page scrolls sideways on a 390 px phone (docs/dashboard.md): every page the dashboard
serves, found from its routes (a new page is checked without a change here), loaded with data in it (a
sequence, a contact in it, a rule whose action names the sequence, a bulk job, a key).

A wide table may scroll inside its own box (``.table-wrap``); the page itself may not. The browser, the
server and the page fixtures are those of tests/test_dashboard_browser.py.
"""

from __future__ import annotations

import re
from typing import Any

from litestar.routes import HTTPRoute
from playwright.sync_api import APIRequestContext, Page

from services.api.app import create_app
from tests.conftest import UNBOUND, Project
from tests.test_dashboard_browser import PHONE, browser, page, server, sign_in  # noqa: F401 (fixtures)

#: Routes that are not pages: fragments a page refreshes itself with, downloads, static files, the catch-all.
NOT_PAGES = re.compile(r"/(timeline|progress)$|\.csv$|^/app/static/|\{rest\}")


def dashboard_pages() -> list[str]:
    """Every GET route of the dashboard that answers a page, with its path parameters unfilled."""
    app = create_app(UNBOUND)
    return sorted(
        route.path_format
        for route in app.routes
        if isinstance(route, HTTPRoute)
        and route.path_format.startswith("/app")
        and "GET" in route.methods
        and not NOT_PAGES.search(route.path_format)
    )


def _created(api: APIRequestContext, project: Project, path: str, body: dict[str, Any]) -> Any:
    response = api.post(path, data=body, headers=project.headers)
    assert response.status in (200, 201, 202), (path, response.text())
    return response.json()


def _seed(api: APIRequestContext, project: Project) -> dict[str, str]:
    """One of everything a page shows, with long names (what makes a page wide): path parameter -> value."""
    contact = _created(
        api,
        project,
        "/v1/contacts",
        {"phone": "+14155550100", "name": "Ada Lovelace-Byron of Somewhere Far", "tags": ["vip-customer"]},
    )
    step = {"kind": "message", "text": "Hello {{contact.name}}, " + "a long line of text " * 8}
    sequence = _created(
        api,
        project,
        "/v1/sequences",
        {"name": "Welcome series for new customers", "definition": {"steps": [step, step]}},
    )
    _created(api, project, f"/v1/sequences/{sequence['id']}/publish", {})
    enrollment = _created(
        api, project, "/v1/enrollments", {"sequence_id": sequence["id"], "contact_id": contact["id"]}
    )
    rule = _created(
        api,
        project,
        "/v1/rules",
        {
            "name": "Enroll the tagged ones after a long while",
            "event": "contact.tag_added",
            "execution_delay_minutes": 90,
            "actions": [
                {"type": "enroll_in_sequence", "sequence_id": sequence["id"]},
                {"type": "add_contact_tag", "tags": ["followed-up-by-the-rule"]},
            ],
        },
    )
    job = _created(
        api, project, "/v1/bulk-enrollments", {"sequence_id": sequence["id"], "contact_ids": [contact["id"]]}
    )
    _created(api, project, "/v1/api-keys", {"name": "the send lane of the main number", "scope": "events"})
    return {
        "sequence_id": sequence["id"],
        "index": "0",
        "enrollment_id": enrollment["id"],
        "job_id": job["id"],
        "rule_id": rule["id"],
        "contact_id": contact["id"],
    }


def test_the_pages_are_found_from_the_routes() -> None:
    found = dashboard_pages()
    assert {"/app/sequences", "/app/rules", "/app/contacts/{contact_id}", "/app/settings"} <= set(found)
    assert not [path for path in found if NOT_PAGES.search(path)]


def test_no_page_is_wider_than_a_phone(page: Page, project: Project) -> None:  # noqa: F811
    ids = _seed(page.request, project)
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
