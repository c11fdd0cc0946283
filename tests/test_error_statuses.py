"""One table of error statuses: every domain error has the same status (and title) in a REST problem and on a
dashboard page, and no module of the API keeps a table of its own."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import pytest
from litestar import Litestar

from libs.common.core.errors import (
    AlreadyExists,
    Conflict,
    DatabaseUnavailable,
    FollowupsError,
    InvalidInput,
    NotFound,
    Unauthorized,
)
from libs.common.core.runtime import Runtime
from libs.common.followups.enrollments import EnrollmentRejected
from libs.common.rules.actions import ActionRejected
from services.api.problems import status_of, title_of
from tests.conftest import Project, client_of, sign_in

API = Path(__file__).parent.parent / "services" / "api"


@pytest.mark.parametrize(
    ("error", "status", "title"),
    [
        (NotFound(), 404, "Not found"),
        (InvalidInput(), 422, "Invalid input"),
        (Conflict(), 409, "Conflict"),
        (AlreadyExists(), 409, "Conflict"),
        (ActionRejected("opted_out"), 409, "Conflict"),
        (Unauthorized(), 401, "Unauthorized"),
        (DatabaseUnavailable(), 503, "Unavailable"),
        (FollowupsError(), 400, "Bad request"),
    ],
)
def test_each_domain_error_has_one_status_and_title(error: FollowupsError, status: int, title: str) -> None:
    assert (status_of(error), title_of(status)) == (status, title)


def test_a_subclass_of_a_listed_error_takes_its_status() -> None:
    assert status_of(EnrollmentRejected()) == 409
    assert title_of(418) == "Error"


def test_no_module_of_the_api_keeps_its_own_status_table() -> None:
    table = re.compile(r"STATUS_OF\.items|isinstance\(exc, kind\)|\btitles = \{")
    copies = [
        str(path.relative_to(API))
        for path in API.rglob("*.py")
        if path.name != "problems.py" and table.search(path.read_text())
    ]
    assert copies == []


def test_rest_and_dashboard_answer_an_unknown_sequence_alike(
    api_app: Litestar, runtime: Runtime, project: Project
) -> None:
    missing = uuid.uuid4()
    with client_of(api_app, runtime) as client:
        problem = client.get(f"/v1/sequences/{missing}", headers=project.headers)
        sign_in(client, project)
        page: Any = client.get(f"/app/sequences/{missing}")
    assert (problem.status_code, problem.json()["title"]) == (404, "Not found")
    assert page.status_code == 404
    assert "<h1>Not found</h1>" in page.text
