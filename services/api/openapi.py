"""The OpenAPI document, completed: every error an operation can answer, as ``application/problem+json``.

Litestar documents what a handler returns and a generic 400. :func:`complete` adds what the application
around the handlers does, derived from each handler so a new route is documented the same way:

- 401 (with ``WWW-Authenticate``), 429 (with ``Retry-After``: :mod:`services.api.limits`) and the bearer
  requirement where the handler takes ``project_id`` (its caller's project), and 403 naming the scope the
  operation needs (:mod:`services.api.scopes`); every other operation (``/health``, ``/ready``) overrides
  the document's bearer requirement with none;
- 400 where the operation takes a body, a query or a free-text path parameter (a path that is not a UUID
  where one is expected matches no route: 404); 404 where its path names a resource; 413 and 422 where
  it takes a body, 422 where it takes a query or a free-text path parameter; 503 (with ``Retry-After``)
  where it reads the database;
- the statuses a route declares itself (``responses=conflict(...)``, ``not_found(...)``), such as a 409.

Each error response is one shared component, ``Problem`` (RFC 9457, as :mod:`services.api.problems` builds
it). Request schemas carry the bounds the server enforces because they are generated from the same
``msgspec.Meta`` annotations that the strict decoding checks: Litestar renders a field's own bounds, and
:func:`complete` adds those it drops (a list's items, a dict's keys and size, a bound of 0) from msgspec's
own JSON Schema of the request bodies. An answer's dict whose keys are a closed set (a bulk job's
``skipped``, by reason) names them (``propertyNames``), from msgspec's schema of what the handlers answer.

Then :func:`complete` makes the document say what a client generator needs: each request struct that
refuses unknown fields says so (``additionalProperties: false``, from msgspec's schema), a nullable enum is
one enum or null (``oneOf``, not a type list with ``null`` among the values), the headers a handler reads
are declared (``Idempotency-Key``), and generic components are named as a class can be
(``ContactPage``, not ``Page_libs.common.platform.contacts.Contact_``). :func:`allow_every_method` makes
an ``OPTIONS`` answer name every method of its path.

``/schema`` renders the document with Redoc from files the product serves (:func:`render_plugins`,
:func:`assets_router`): no CDN, no web font, so the reference works offline and no request leaves the
machine.
"""

from __future__ import annotations

import dataclasses
import re
import typing
import uuid
from pathlib import Path
from typing import Any

import msgspec
from litestar import Litestar, Response, Router
from litestar.constants import RESERVED_KWARGS
from litestar.handlers import HTTPRouteHandler
from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.plugins import OpenAPIRenderPlugin, RedocRenderPlugin
from litestar.openapi.spec import (
    Components,
    OpenAPI,
    OpenAPIHeader,
    OpenAPIMediaType,
    OpenAPIResponse,
    OpenAPIType,
    Operation,
    Parameter,
    Reference,
    Schema,
)
from litestar.routes import HTTPRoute
from litestar.static_files import create_static_files_router
from litestar.types import Message, Scope

from services.api import scopes
from services.api.problems import PROBLEM_JSON, RETRY_AFTER_SECONDS

#: The security scheme of ``/v1/``: a project's API key as a bearer token.
BEARER = "bearer"

#: The files ``/schema`` loads: Redoc's standalone bundle and its licences (their README says how to upgrade).
ASSETS = Path(__file__).parent / "schema_assets"
#: Where the product serves them.
ASSETS_PATH = "/schema/assets"
#: The Redoc release in :data:`ASSETS`.
REDOC_VERSION = "2.5.4"

#: RFC 9457 problem details, as every error of the API is answered.
PROBLEM_SCHEMA = Schema(
    type=OpenAPIType.OBJECT,
    description="An error (RFC 9457 problem details); `errors` names each offending field.",
    required=["type", "title", "status", "detail"],
    properties={
        "type": Schema(type=OpenAPIType.STRING, description="always `about:blank`"),
        "title": Schema(type=OpenAPIType.STRING, description="the status's name"),
        "status": Schema(type=OpenAPIType.INTEGER, minimum=400, maximum=599),
        "detail": Schema(type=OpenAPIType.STRING, description="what went wrong, for a person"),
        "code": Schema(
            type=OpenAPIType.STRING,
            description="a business rejection's stable code (`already_enrolled`, `plan_limit`, ...)",
        ),
        "errors": Schema(
            type=OpenAPIType.ARRAY,
            items=Schema(
                type=OpenAPIType.OBJECT,
                required=["field", "message"],
                properties={
                    "field": Schema(
                        type=OpenAPIType.STRING,
                        description="a dotted path, list indexes included: `definition.steps.0.text`",
                    ),
                    "message": Schema(type=OpenAPIType.STRING),
                },
            ),
        ),
    },
)

_DESCRIPTIONS = {
    400: "The request's shape is wrong: malformed JSON, an unknown or missing field, a wrong type, an "
    "unparseable id or time.",
    401: "No valid API key: `Authorization: Bearer <api key>`.",
    404: "No such resource in the caller's project.",
    409: "The request conflicts with the stored state.",
    413: "The request body is larger than the operation takes.",
    422: "A well-formed value the server refuses: out of its bounds, unknown, or invalid.",
    429: "Too many requests from this API key, or too many wrong keys from this address; retry after "
    "`Retry-After` seconds (docs/api.md, Limits).",
    503: "The database is unreachable; retry after `Retry-After` seconds.",
}

_HEADERS = {
    401: {
        "WWW-Authenticate": OpenAPIHeader(
            schema=Schema(type=OpenAPIType.STRING), description="`Bearer`", required=True
        )
    },
    429: {
        "Retry-After": OpenAPIHeader(
            schema=Schema(type=OpenAPIType.INTEGER, minimum=1),
            description="seconds until the limit allows one more request",
            required=True,
        )
    },
    503: {
        "Retry-After": OpenAPIHeader(
            schema=Schema(type=OpenAPIType.INTEGER, minimum=0),
            description=f"seconds to wait before retrying ({RETRY_AFTER_SECONDS})",
            required=True,
        )
    },
}

#: Request headers a handler reads itself (``request.headers``), as the operations that read them declare
#: them: (method, path) -> parameter.
_HEADER_PARAMETERS = {
    ("POST", "/v1/bulk-enrollments"): Parameter(
        name="Idempotency-Key",
        param_in="header",
        required=False,
        description="A key of the caller's choosing: a retry with the same key answers the job it created "
        "(200) instead of creating another.",
        schema=Schema(type=OpenAPIType.STRING, min_length=1, max_length=200),
    ),
}

#: Statuses of operations that no handler property tells: ``/ready`` answers 503 when PostgreSQL does not.
_EXTRA_STATUSES: dict[tuple[str, str], set[int]] = {("GET", "/ready"): {503}}


def conflict(description: str) -> dict[int, ResponseSpec]:
    """A route's ``responses`` for a 409: what the request can conflict with."""
    return {409: ResponseSpec(data_container=None, description=description)}


def not_found(description: str) -> dict[int, ResponseSpec]:
    """A route's ``responses`` for a 404 about a resource its body (not its path) names."""
    return {404: ResponseSpec(data_container=None, description=description)}


def invalid(description: str) -> dict[int, ResponseSpec]:
    """A route's ``responses`` for a 422 that is not about its parameters (a draft that cannot publish)."""
    return {422: ResponseSpec(data_container=None, description=description)}


def render_plugins() -> list[OpenAPIRenderPlugin]:
    """``/schema`` (and ``/schema/redoc``): Redoc from :data:`ASSETS_PATH`, without Google Fonts or the CDN
    favicon Litestar's defaults load."""
    return [
        RedocRenderPlugin(
            path=["/", "/redoc"],
            js_url=f"{ASSETS_PATH}/redoc.standalone.js",
            google_fonts=False,
            favicon="",
        )
    ]


def assets_router() -> Router:
    """The static files of :data:`ASSETS` under :data:`ASSETS_PATH`."""
    return create_static_files_router(
        path=ASSETS_PATH, directories=[ASSETS], name="schema-assets", include_in_schema=False
    )


def complete(app: Litestar) -> OpenAPI:
    """Complete ``app``'s OpenAPI document in place (see the module) and return it."""
    document = app.openapi_schema
    components = document.components if isinstance(document.components, Components) else Components()
    document.components = components
    components.schemas = {**(components.schemas or {}), "Problem": PROBLEM_SCHEMA}
    _add_bounds(components.schemas, app)
    _add_key_names(components.schemas, app)
    _walk(document, _one_nullable_enum)
    for route in app.routes:
        if not isinstance(route, HTTPRoute) or document.paths is None:
            continue
        path_item = document.paths.get(route.path_format or "/")
        if path_item is None:
            continue
        for method, (handler, _) in route.route_handler_map.items():
            operation = getattr(path_item, method.lower(), None)
            if isinstance(operation, Operation):
                _complete_operation(operation, handler, route, method)
    _name_generics(document, components)
    return document


def _error_statuses(handler: HTTPRouteHandler, route: HTTPRoute, method: str) -> set[int]:
    """The errors the application around ``handler`` can answer (see the module)."""
    parameters = handler.parsed_fn_signature.parameters
    authenticated = "project_id" in parameters
    takes_body = "data" in parameters
    path_names = set(route.path_parameters)
    dependencies = set(handler.resolve_dependencies())
    queries = set(parameters) - path_names - dependencies - RESERVED_KWARGS - {"self"}
    free_text_path = any(definition.type is not uuid.UUID for definition in route.path_parameters.values())
    statuses = set(_EXTRA_STATUSES.get((method, route.path_format), set()))
    if takes_body or queries or free_text_path:  # a malformed UUID in the path matches no route: 404
        statuses.add(400)
    if authenticated:
        statuses |= {401, 403, 429, 503}
    if path_names:
        statuses.add(404)
    if takes_body:
        statuses |= {413, 422}
    if queries or free_text_path:
        statuses.add(422)
    return statuses


def _problem_response(status: int, description: str | None = None) -> OpenAPIResponse:
    return OpenAPIResponse(
        description=description or _DESCRIPTIONS.get(status, "An error."),
        content={PROBLEM_JSON: OpenAPIMediaType(schema=Reference(ref="#/components/schemas/Problem"))},
        headers=dict[str, OpenAPIHeader | Reference](_HEADERS[status]) if status in _HEADERS else None,
    )


def _complete_operation(
    operation: Operation, handler: HTTPRouteHandler, route: HTTPRoute, method: str
) -> None:
    # the successes Litestar documented; its errors (a generic 400 of another shape) are replaced
    responses = {status: r for status, r in (operation.responses or {}).items() if int(status) < 400}
    own = handler.responses or {}
    for status in sorted(_error_statuses(handler, route, method) | {code for code in own if code >= 400}):
        spec = own.get(status)  # a route's own description (what a 409 conflicts with) is kept
        description = spec.description if spec is not None else None
        if status == 403 and not handler.opt.get(scopes.SIGNED_OPT):
            description = (
                "The API key's scope does not allow this operation: it needs the "
                f"`{scopes.needed_scope(handler, method)}` scope (`code` is `missing_scope`)."
            )
        responses[str(status)] = _problem_response(status, description)
    operation.responses = dict(sorted(responses.items()))
    header = _HEADER_PARAMETERS.get((method, route.path_format))
    if header is not None:
        operation.parameters = [*(operation.parameters or []), header]
    operation.security = [{BEARER: []}] if "project_id" in handler.parsed_fn_signature.parameters else []


#: JSON Schema's keywords for a bound -> the field of Litestar's ``Schema`` that renders it.
_BOUNDS = {
    "minLength": "min_length",
    "maxLength": "max_length",
    "minItems": "min_items",
    "maxItems": "max_items",
    "minProperties": "min_properties",
    "maxProperties": "max_properties",
    "minimum": "minimum",
    "maximum": "maximum",
    "exclusiveMinimum": "exclusive_minimum",
    "exclusiveMaximum": "exclusive_maximum",
    "pattern": "pattern",
    "uniqueItems": "unique_items",
}


def _add_bounds(schemas: dict[str, Schema], app: Litestar) -> None:
    """Copy onto each request struct's component the bounds msgspec checks that Litestar did not render."""
    bodies = [
        handler.parsed_fn_signature.parameters["data"].annotation
        for route in app.routes
        if isinstance(route, HTTPRoute)
        for handler in route.route_handlers
        if "data" in handler.parsed_fn_signature.parameters
    ]
    _, definitions = msgspec.json.schema_components(bodies)
    for name, definition in definitions.items():
        component = schemas.get(name)
        if component is None or component.title != name or not component.properties:
            continue
        if definition.get("additionalProperties") is False:  # forbid_unknown_fields: an unknown one is 400
            component.additional_properties = False
        for field, expected in definition.get("properties", {}).items():
            actual = component.properties.get(field)
            if isinstance(actual, Schema):
                _merge_bounds(actual, expected)


def _add_key_names(schemas: dict[str, Schema], app: Litestar) -> None:
    """Name the keys of each answer's dict that are a closed set (an enum), as msgspec's schema of the
    structs the handlers answer does: Litestar renders only a dict's values."""
    answers = []
    for route in app.routes:
        if not isinstance(route, HTTPRoute):
            continue
        for handler in route.route_handlers:
            returned = handler.parsed_fn_signature.return_type
            if returned.is_subclass_of(Response):  # Response[X] answers an X
                returned = returned.inner_types[0] if returned.inner_types else returned
            origin = typing.get_origin(returned.annotation) or returned.annotation
            if isinstance(origin, type) and issubclass(origin, msgspec.Struct):
                answers.append(returned.annotation)
    _, definitions = msgspec.json.schema_components(answers)
    for name, definition in definitions.items():
        component = schemas.get(name)
        if component is None or component.title != name or not component.properties:
            continue
        for field, expected in definition.get("properties", {}).items():
            actual = component.properties.get(field)
            names = expected.get("propertyNames")
            if isinstance(actual, Schema) and isinstance(names, dict) and "enum" in names:
                actual.property_names = Schema(type=OpenAPIType.STRING, enum=names["enum"])


def _merge_bounds(actual: Schema, expected: dict[str, Any]) -> None:
    branches = [branch for branch in expected.get("anyOf", [expected]) if branch != {"type": "null"}]
    if len(branches) != 1 or "$ref" in branches[0]:
        return
    expected = branches[0]
    for keyword, attribute in _BOUNDS.items():
        if keyword in expected and getattr(actual, attribute) is None:
            setattr(actual, attribute, expected[keyword])
    if "enum" in expected:  # on the value's own branch: beside a nullable's oneOf it would refuse null
        values = [a for a in actual.one_of or [] if isinstance(a, Schema) and a.type != OpenAPIType.NULL]
        target = values[0] if len(values) == 1 else actual
        if target.enum is None:
            target.enum = expected["enum"]
    if isinstance(expected.get("propertyNames"), dict) and actual.property_names is None:
        actual.property_names = Schema(type=OpenAPIType.STRING)
        _merge_bounds(actual.property_names, expected["propertyNames"])
    if isinstance(expected.get("items"), dict):
        arrays = [actual, *(actual.one_of or [])]
        items = next((a.items for a in arrays if isinstance(a, Schema) and isinstance(a.items, Schema)), None)
        if items is not None:
            _merge_bounds(items, expected["items"])


def _walk(node: Any, visit: Any) -> None:
    """Call ``visit`` on every :class:`Schema` and :class:`Reference` of the document, depth first."""
    if isinstance(node, Schema | Reference):
        visit(node)
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        for field in dataclasses.fields(node):
            _walk(getattr(node, field.name), visit)
    elif isinstance(node, dict):
        for value in node.values():
            _walk(value, visit)
    elif isinstance(node, list | tuple):
        for value in node:
            _walk(value, visit)


def _one_nullable_enum(node: Schema | Reference) -> None:
    """``{"type": ["null", "string"], "enum": [..., null]}`` becomes ``oneOf`` the enum or null, as every
    other nullable field is spelled (a generator made three enums of the first form)."""
    if not isinstance(node, Schema) or not isinstance(node.type, list) or node.enum is None:
        return
    if OpenAPIType.NULL not in node.type or None not in node.enum:
        return
    types = [t for t in node.type if t != OpenAPIType.NULL]
    values = [v for v in node.enum if v is not None]
    node.one_of = [
        Schema(type=types[0] if len(types) == 1 else types, enum=values),
        Schema(type=OpenAPIType.NULL),
    ]
    node.type = None
    node.enum = None


#: A generic component's name as Litestar writes it: ``Page_libs.common.platform.contacts.Contact_``.
_GENERIC = re.compile(r"^(?P<outer>[A-Za-z]+)_(?:[\w]+\.)*(?P<inner>\w+?)_$")


#: Components renamed so that no generated class clashes with another: a generator names the enum of
#: ``Message.status`` ``MessageStatus``, the name of the status report event's struct.
_RENAMED = {"MessageStatus": "MessageStatusReport"}


def _name_generics(document: OpenAPI, components: Components) -> None:
    """Rename each generic component to a name a class can have (``ContactPage``), and those of
    :data:`_RENAMED`; and their references."""
    renamed = {name: new for name, new in _RENAMED.items() if name in (components.schemas or {})}
    for name in list(components.schemas or {}):
        found = _GENERIC.match(name)
        if found is not None:
            renamed[name] = f"{found['inner']}{found['outer']}"
    if not renamed or components.schemas is None:
        return
    for name, schema in components.schemas.items():
        if name in renamed:  # a generator names the class by the title (``Page[Contact]``) where there is one
            schema.title = renamed[name]
    components.schemas = {renamed.get(name, name): schema for name, schema in components.schemas.items()}
    prefix = "#/components/schemas/"

    def rename(node: Schema | Reference) -> None:
        if isinstance(node, Reference) and node.ref.startswith(prefix):
            node.ref = prefix + renamed.get(node.ref.removeprefix(prefix), node.ref.removeprefix(prefix))

    _walk(document, rename)


def allow_every_method(app: Litestar) -> None:
    """Litestar answers ``OPTIONS`` with the methods of the first handler registered on a path (``Allow:
    OPTIONS, POST`` where GET is there too): note each path's methods, for :func:`correct_allow`."""
    allowed = {}
    for route in app.routes:
        if isinstance(route, HTTPRoute) and "OPTIONS" in route.route_handler_map:
            handler, _ = route.route_handler_map["OPTIONS"]
            allowed[handler] = ", ".join(sorted(route.methods)).encode()
    app.state[_ALLOWED] = allowed


_ALLOWED = "followups.allowed_methods"


async def correct_allow(message: Message, scope: Scope) -> None:
    """``before_send``: the ``Allow`` of an ``OPTIONS`` answer names every method of its path."""
    if message["type"] != "http.response.start" or scope.get("method") != "OPTIONS":
        return
    allowed = scope["litestar_app"].state.get(_ALLOWED, {}).get(scope.get("route_handler"))
    if allowed is not None:
        headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"allow"]
        message["headers"] = [*headers, (b"allow", allowed)]
