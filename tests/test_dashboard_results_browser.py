"""The results page of a sequence with an experiment in a real browser (the fixtures of
tests/test_dashboard_browser.py: Debian's Chromium, the app under uvicorn over the test's runtime): the
funnel per path, the variants with their intervals, and choosing a winner with its button."""

from __future__ import annotations

from datetime import timedelta

from playwright.sync_api import Page, expect

from libs.common.core.clock import ManualClock
from libs.common.core.runtime import Runtime
from tests.conftest import Project

# the browser tests' fixtures (skipped as they are without Chromium)
from tests.test_dashboard_browser import browser, page, screenshot, server, sign_in  # noqa: F401
from tests.test_sequence_results import GOALS, STEPS, finish, settle


def test_see_each_variant_and_choose_the_winner(
    page: Page,  # noqa: F811 (the fixture imported above)
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
