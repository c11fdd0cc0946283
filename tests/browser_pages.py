"""What the browser tests of tests/test_dashboard_browser.py load: every dashboard page, found from the
routes (a new page is checked without a change there), and one of everything a page shows, created through
the API with long names (what makes a page wide)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from litestar.routes import HTTPRoute

from libs.common.core.runtime import Runtime
from services.api.app import create_app
from tests.conftest import UNBOUND, Project
from tests.rule_helpers import process

if TYPE_CHECKING:  # the dev extra installs playwright; the browser tests skip without it
    from playwright.sync_api import APIRequestContext

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


def seed_every_kind(api: APIRequestContext, project: Project, runtime: Runtime) -> dict[str, str]:
    """One of everything a page shows, with long names (what makes a page wide): path parameter -> value.
    The triggers service runs the rule once (``run_id``)."""
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
    _created(api, project, f"/v1/contacts/{contact['id']}/tags", {"tags": ["tagged-by-the-seed"]})
    process(runtime)
    runs = api.get(f"/v1/rules/{rule['id']}/runs", headers=project.headers).json()["items"]
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
        "run_id": runs[0]["trigger_id"],
        "contact_id": contact["id"],
    }
