"""The web dashboard under ``/app/``: server-rendered pages of the API service (Jinja templates, a little
vanilla JavaScript for live parts, no front-end build).

A thin transport like the REST routes: each handler decodes a form, calls the same domain functions as
``services/api/routes`` through :func:`services.api.deps.transaction`, and renders a page. Forms name their
fields with the API's field paths, so the domain's errors are shown next to the input they name
(:mod:`.forms`). Sign-in, sessions and CSRF: :mod:`.session` and :mod:`.hooks`. See ``docs/dashboard.md``.
"""

from __future__ import annotations

from pathlib import Path

from litestar import Router
from litestar.static_files import create_static_files_router

from services.api.dashboard import hooks
from services.api.dashboard.api_keys import ApiKeysController
from services.api.dashboard.auth import AuthController
from services.api.dashboard.bulk import BulkController
from services.api.dashboard.contacts import ContactsController
from services.api.dashboard.enrollments import EnrollmentsController
from services.api.dashboard.rules import RulesController
from services.api.dashboard.sequence_history import SequenceHistoryController
from services.api.dashboard.sequence_preview import SequencePreviewController
from services.api.dashboard.sequence_steps import SequenceStepsController
from services.api.dashboard.sequences import SequencesController
from services.api.dashboard.session import Signer, secret_from_environment
from services.api.dashboard.settings import SettingsController

STATIC = Path(__file__).parent / "static"


def dashboard_router(secret: bytes | None = None) -> Router:
    """Every page under ``/app/`` and its static files; ``secret`` signs sessions and CSRF tokens
    (default: ``DASHBOARD_SECRET``, else a random one for this process: see :mod:`.session`)."""
    signer = Signer(secret if secret is not None else secret_from_environment())
    pages = Router(
        path="/",
        route_handlers=[
            AuthController,
            SequencesController,
            SequenceStepsController,
            SequenceHistoryController,
            SequencePreviewController,
            EnrollmentsController,
            BulkController,
            RulesController,
            ContactsController,
            SettingsController,
            ApiKeysController,
        ],
        before_request=hooks.before_request,
        exception_handlers=hooks.EXCEPTION_HANDLERS,
        opt={"dashboard_signer": signer},
    )
    static = create_static_files_router(
        path="/static", directories=[STATIC], name="dashboard-static", include_in_schema=False
    )
    return Router(path="/app", route_handlers=[pages, static], include_in_schema=False)
