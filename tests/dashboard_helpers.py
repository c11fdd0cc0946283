"""What the dashboard tests share: reading a page (the error next to a field), calling the API beside
the dashboard, creating rules, sequences and enrollments through its forms.

Forms are posted as a browser posts them; field errors are asserted next to the input they name (the
``f-<field>-error`` paragraph that the input's ``aria-describedby`` points at).
"""

from __future__ import annotations

import html
import re
from typing import Any

from litestar.testing import TestClient

from services.api.dashboard.forms import field_id
from tests.conftest import Project
from tests.helpers import rows


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


def api(client: TestClient[Any], project: Project, method: str, path: str, **kwargs: Any) -> Any:
    response = client.request(method, path, headers=project.headers, **kwargs)
    assert response.status_code < 300, response.text
    return response.json() if response.content else None


def create_rule_via_form(client: TestClient[Any], token: str, **fields: str) -> str:
    response = client.post(
        "/app/rules/new",
        data={"_csrf": token, "active": "on", "_op": "save", **fields},
        follow_redirects=False,
    )
    assert response.status_code == 303, errors_on(response.text)
    return response.headers["location"].split("/")[3].split("?")[0]


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


def enroll(client: TestClient[Any], token: str, sequence_id: str, contact: str, **fields: str) -> str:
    response = client.post(
        "/app/enrollments/new",
        data={"_csrf": token, "sequence_id": sequence_id, "contact": contact, **fields},
        follow_redirects=False,
    )
    assert response.status_code == 303, errors_on(response.text)
    return response.headers["location"].split("/")[3].split("?")[0]


def bulk_upload(client: TestClient[Any], token: str, sequence_id: str, csv_text: str, **fields: str) -> str:
    response = client.post(
        "/app/bulk/new",
        data={"_csrf": token, "sequence_id": sequence_id, **fields},
        files={"file": ("contacts.csv", csv_text.encode(), "text/csv")},
        follow_redirects=False,
    )
    assert response.status_code == 303, errors_on(response.text)
    return response.headers["location"].split("/")[3].split("?")[0]


def draft_of_steps(pool: Any, sequence_id: str) -> list[Any]:
    """The steps of a sequence's draft as stored."""
    return list(
        rows(pool, "SELECT draft FROM followup_sequences WHERE id = %s", sequence_id)[0][0].get("steps", [])
    )
