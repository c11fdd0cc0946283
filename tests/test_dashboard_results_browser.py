"""The results page of a sequence with an experiment in a real browser (the fixtures of
tests/test_dashboard_browser.py: Debian's Chromium, the app under uvicorn over the test's runtime): the
funnel per path, the variants with their intervals, and choosing a winner with its button."""

from __future__ import annotations

from playwright.sync_api import Page, expect

from libs.common.core.runtime import Runtime
from tests.conftest import Project

# the browser tests' fixtures (skipped as they are without Chromium)
from tests.test_dashboard_browser import browser, page, screenshot, server, sign_in  # noqa: F401
from tests.test_sequence_results import GOALS, STEPS, finish, run


def test_see_each_variant_and_choose_the_winner(page: Page, project: Project, runtime: Runtime) -> None:  # noqa: F811
    api = page.request
    created = api.post(
        "/v1/sequences",
        headers=project.headers,
        data={"name": "Spring offer", "definition": {"steps": list(STEPS), "goals": GOALS}},
    )
    assert created.status == 201, created.text()
    sequence_id = created.json()["id"]
    assert api.post(f"/v1/sequences/{sequence_id}/publish", headers=project.headers).status == 201
    now = runtime.clock.now()
    # four contacts down the experiment's arms (step runs and columns as the release writes them)
    for n, (variant, converted) in enumerate((("a", True), ("a", False), ("b", False), ("holdout", False))):
        contact = api.post("/v1/contacts", headers=project.headers, data={"phone": f"+1415555077{n}"}).json()
        enrollment = api.post(
            "/v1/enrollments",
            headers=project.headers,
            data={"sequence_id": sequence_id, "contact_id": contact["id"]},
        ).json()["id"]
        run(runtime.pool, enrollment, 0, "queued", None)
        run(runtime.pool, enrollment, 1, "branched", "otherwise")
        run(
            runtime.pool,
            enrollment,
            2,
            "branched",
            "holdout" if variant == "holdout" else f"variant:{variant}",
        )
        if variant != "holdout":
            run(runtime.pool, enrollment, 3 if variant == "a" else 4, "queued", None)
        finish(
            runtime.pool,
            enrollment,
            status="completed",
            finished_at=now,
            goal="won" if converted else None,
            converted_at=now if converted else None,
            converted_step=3 if converted else None,
            assignments={"offer": variant},
        )
    sign_in(page, project)
    page.goto(f"/app/sequences/{sequence_id}/results")
    expect(page.get_by_role("heading", name="Paths")).to_be_visible()
    expect(
        page.get_by_role("img", name="Each path's enrollments, follow-ups, replies and conversions")
    ).to_be_visible()
    variants = page.get_by_role("table", name="The variants of offer")
    row_a = variants.locator('tr[data-variant="a"]')
    expect(row_a.locator('[data-count="rate"]')).to_have_text("50.0 %")
    expect(row_a.locator('[data-count="interval"]')).to_have_text("9.5 % to 90.5 %")
    expect(variants.locator('tr[data-variant="holdout"]').get_by_role("button")).to_have_count(0)
    screenshot(page, "sequence-experiment")
    row_a.get_by_role("button", name="Choose winner").click()
    expect(page.get_by_text("Winner chosen")).to_be_visible()
    expect(row_a.get_by_text("winner", exact=True)).to_be_visible()
    expect(row_a.get_by_role("button", name="Choose winner")).to_have_count(0)
    expect(
        variants.locator('tr[data-variant="b"]').get_by_role("button", name="Choose winner")
    ).to_be_visible()
    current = api.get(f"/v1/sequences/{sequence_id}", headers=project.headers).json()
    assert current["current_version"] == 2 and current["draft"]["steps"][2]["winner"] == "a"
