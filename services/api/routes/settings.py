"""The project's follow-up settings: sending constraints and retention."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, get, put
from litestar.params import JSONBody

from libs.common.followups import project_settings
from libs.common.followups.project_settings import ProjectSettings
from services.api.deps import ProjectId, runtime_of, transaction


class SettingsController(Controller):
    path = "/v1/settings"
    tags = ["settings"]

    @get("/", sync_to_thread=True)
    def read(self, request: Request[Any, Any, Any], project_id: ProjectId) -> ProjectSettings:
        """The project's settings (the defaults constrain nothing)."""
        with transaction(runtime_of(request)) as conn:
            return project_settings.get_settings(conn, project_id)

    @put("/", sync_to_thread=True)
    def replace(
        self, request: Request[Any, Any, Any], project_id: ProjectId, data: JSONBody[ProjectSettings]
    ) -> ProjectSettings:
        """Replace the settings (an absent field takes its default). Every release from the next one on
        obeys them, in every process. An ``ai_monthly_token_budget`` above the operator's cap
        (``AI_MAX_MONTHLY_TOKENS_PER_PROJECT``) is refused, 422."""
        runtime = runtime_of(request)
        with transaction(runtime) as conn:
            return project_settings.put_settings(
                conn,
                project_id,
                data,
                now=runtime.clock.now(),
                ai_token_cap=runtime.settings.ai.max_monthly_tokens_per_project,
            )
