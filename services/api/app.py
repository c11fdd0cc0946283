"""The Litestar application."""

from __future__ import annotations

from litestar import Litestar
from litestar.datastructures import State
from litestar.di import Provide
from litestar.openapi import OpenAPIConfig
from litestar.openapi.spec import Components, SecurityScheme

from libs.common.core.runtime import Runtime
from services.api import limits, openapi, scopes
from services.api.body import MAX_BODY_BYTES, StrictRequest
from services.api.dashboard import dashboard_router
from services.api.deps import project_id
from services.api.problems import EXCEPTION_HANDLERS
from services.api.routes.api_keys import ApiKeysController
from services.api.routes.bulk import BulkEnrollmentsController, CampaignsController
from services.api.routes.contacts import ContactsController
from services.api.routes.conversations import ConversationsController
from services.api.routes.enrollments import EnrollmentsController
from services.api.routes.events import EventsController
from services.api.routes.messages import MessagesController
from services.api.routes.numbers import NumbersController
from services.api.routes.portfolios import PortfoliosController
from services.api.routes.providers import ChannelsController, ProviderWebhooksController
from services.api.routes.rules import RulesController, WebhookDeliveriesController
from services.api.routes.send_lane import SendLaneController
from services.api.routes.sequences import SequencesController
from services.api.routes.settings import SettingsController
from services.api.routes.system import health, prometheus_metrics, ready, size_request_threads

API_VERSION = "0.1.0"


def create_app(runtime: Runtime) -> Litestar:
    """The API over ``runtime`` (its pool, broker and clock)."""
    app = Litestar(
        route_handlers=[
            health,
            ready,
            prometheus_metrics,
            ContactsController,
            SequencesController,
            EnrollmentsController,
            ConversationsController,
            MessagesController,
            EventsController,
            SendLaneController,
            NumbersController,
            PortfoliosController,
            ChannelsController,
            ProviderWebhooksController,
            SettingsController,
            RulesController,
            WebhookDeliveriesController,
            BulkEnrollmentsController,
            CampaignsController,
            ApiKeysController,
            dashboard_router(),  # the web dashboard under /app/ (services.api.dashboard)
            openapi.assets_router(),  # what /schema loads, served here (services.api.openapi)
        ],
        dependencies={"project_id": Provide(project_id, sync_to_thread=True)},
        exception_handlers=EXCEPTION_HANDLERS,
        request_class=StrictRequest,
        request_max_body_size=MAX_BODY_BYTES,
        state=State({"runtime": runtime, **limits.state()}),
        middleware=[limits.middleware],  # throttling, before any handler (services.api.limits)
        before_send=[limits.observe, openapi.correct_allow],
        on_startup=[size_request_threads],
        openapi_config=OpenAPIConfig(
            title="followups",
            version=API_VERSION,
            description="Follow-up sequences and automation rules for conversational channels.",
            components=Components(
                security_schemes={"bearer": SecurityScheme(type="http", scheme="bearer")},
            ),
            security=[{"bearer": []}],
            render_plugins=openapi.render_plugins(),
        ),
        debug=False,
        logging_config=None,
    )
    scopes.check_routes(app)  # every /v1 route authenticates and needs a scope (services.api.scopes)
    openapi.complete(app)  # errors, security and bounds of every operation (services.api.openapi)
    openapi.allow_every_method(app)  # OPTIONS names every method of its path
    return app
