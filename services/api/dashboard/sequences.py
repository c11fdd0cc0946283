"""Sequences: the list (status, live counts) and the builder (the sequence's name and options), publish,
pause / resume / archive. A sequence's steps are :mod:`.sequence_steps`, its versions and results
:mod:`.sequence_history`.

The builder edits the draft with ``update_sequence`` like ``PATCH /v1/sequences/{id}``; publishing is
``publish_sequence``, whose errors name ``definition.steps.<i>.<field>`` and are shown on that step.
"""

from __future__ import annotations

import uuid
from typing import Any

import msgspec
from litestar import Controller, Request, Response, get, post
from litestar.params import FromPath

from libs.common.core.errors import FollowupsError, NotFound
from libs.common.followups import sequences, statistics
from libs.common.followups.definition import Definition, placeholder_warnings
from libs.common.followups.send_window import WEEKDAYS, SendWindow, validate_window
from libs.common.followups.sequences import Sequence, SequenceCreate, SequenceUpdate
from libs.common.platform import numbers
from services.api.dashboard.base import paged, project_of, query_uuid, see_other
from services.api.dashboard.forms import Form, FormErrors, error_of, validation_error
from services.api.dashboard.render import page
from services.api.dashboard.step_form import describe
from services.api.deps import runtime_of, transaction
from services.api.problems import status_of

#: The statuses the list filters on.
STATUS_FILTERS = ("draft", "active", "paused", "archived")
#: The re-entry choices of the options, as the builder words them.
REENTRY = [
    ("after_finished", "again once the previous enrollment finished"),
    ("never", "never: a contact enters once"),
    ("always", "always: a new enrollment replaces the live one"),
]
#: What stops an enrollment, as the builder words it.
STOP_ON = [
    ("reply", "the contact replies"),
    ("human_message", "an agent writes to the contact"),
    ("opt_out", "the contact opts out"),
    ("lead_closed", "the contact's lead closes"),
    ("conversation_resolved", "the conversation is resolved"),
]


def definition_of(sequence: Sequence) -> Definition:
    """The draft definition of a sequence (what the builder edits)."""
    return sequence.draft


def step_errors(errors: FormErrors, index: int) -> FormErrors:
    """The errors about step ``index`` of the definition, named as the step form's inputs."""
    prefix = f"definition.steps.{index}"
    out = FormErrors()
    for where, message in errors.about(prefix):
        out.add(where.removeprefix(prefix).lstrip("."), message)
    return out


def builder_page(
    request: Request[Any, Any, Any],
    sequence_id: uuid.UUID,
    *,
    errors: FormErrors | None = None,
    status: int = 200,
    options: dict[str, Any] | None = None,
    name: str | None = None,
) -> Response[str]:
    """The builder of a sequence: its steps (each with its errors and its warnings: a placeholder
    without a fallback), its options, its counts."""
    project_id = project_of(request)
    with transaction(runtime_of(request)) as conn:
        sequence = sequences.get_sequence(conn, project_id, sequence_id)
        found_numbers = numbers.list_numbers(conn, project_id, limit=200)
        counts = statistics.sequence_counts(conn, project_id, [sequence_id])[sequence_id]
    definition = definition_of(sequence)
    errors = errors or FormErrors()
    warnings = placeholder_warnings(definition)
    return page(
        request,
        "sequences/builder.html",
        status=status,
        title=sequence.name,
        sequence=sequence,
        counts=counts,
        steps=[
            (
                describe(step),
                step_errors(errors, i),
                [w for w in warnings if w.field.startswith(f"definition.steps.{i}.")],
            )
            for i, step in enumerate(definition.steps)
        ],
        definition=definition,
        options=options or _options_of(definition),
        name=sequence.name if name is None else name,
        errors=errors,
        reentry=REENTRY,
        stop_on=STOP_ON,
        weekdays=WEEKDAYS,
        numbers=[("", "any: the enrollment's, the conversation's, the default")]
        + [(str(n.id), f"{n.name or n.phone} ({n.status})") for n in found_numbers],
    )


class SequencesController(Controller):
    """The list of sequences, and a sequence's builder: its name, options, publishing and status."""

    path = "/sequences"

    # --- the list --------------------------------------------------------------------------------------

    @get("/", sync_to_thread=True)
    def list(self, request: Request[Any, Any, Any]) -> Response[str]:
        return self._list(request, FormErrors(), "", 200)

    @post("/new", sync_to_thread=True)
    def create(self, request: Request[Any, Any, Any]) -> Response[str]:
        name = Form.of(request).get("name")
        try:
            with transaction(runtime_of(request)) as conn:
                sequence = sequences.create_sequence(conn, project_of(request), SequenceCreate(name=name))
        except FollowupsError as exc:
            return self._list(request, error_of(exc), name, status_of(exc))
        return see_other(f"/app/sequences/{sequence.id}", notice="created")

    def _list(
        self, request: Request[Any, Any, Any], errors: FormErrors, name: str, status: int
    ) -> Response[str]:
        project_id = project_of(request)
        status_filter = request.query_params.get("status")
        status_filter = status_filter if status_filter in STATUS_FILTERS else None
        with transaction(runtime_of(request)) as conn:
            rows = sequences.list_sequences(
                conn,
                project_id,
                limit=51,
                after=query_uuid(request, "after"),
                status=status_filter,
                include_archived=False,  # "All" is every sequence but the archived ones
            )
            items, cursor = paged(rows)
            counts = statistics.sequence_counts(conn, project_id, [s.id for s in items])
        return page(
            request,
            "sequences/list.html",
            status=status,
            title="Sequences",
            sequences=[(s, counts[s.id]) for s in items],
            cursor=cursor,
            status_filter=status_filter,
            statuses=STATUS_FILTERS,
            errors=errors,
            name=name,
        )

    # --- the builder -----------------------------------------------------------------------------------

    @get("/{sequence_id:uuid}", sync_to_thread=True)
    def builder(self, request: Request[Any, Any, Any], sequence_id: FromPath[uuid.UUID]) -> Response[str]:
        return builder_page(request, sequence_id)

    @post("/{sequence_id:uuid}/rename", sync_to_thread=True)
    def rename(self, request: Request[Any, Any, Any], sequence_id: FromPath[uuid.UUID]) -> Response[str]:
        name = Form.of(request).get("name")
        try:
            with transaction(runtime_of(request)) as conn:
                sequences.update_sequence(conn, project_of(request), sequence_id, SequenceUpdate(name=name))
        except FollowupsError as exc:
            if isinstance(exc, NotFound):
                raise
            return builder_page(request, sequence_id, errors=error_of(exc), status=status_of(exc), name=name)
        return see_other(f"/app/sequences/{sequence_id}", notice="saved")

    @post("/{sequence_id:uuid}/options", sync_to_thread=True)
    def options(self, request: Request[Any, Any, Any], sequence_id: FromPath[uuid.UUID]) -> Response[str]:
        form = Form.of(request)
        options = {
            "reentry": form.get("definition.reentry") or "after_finished",
            "stop_on": {key: form.checked(f"definition.stop_on.{key}") for key, _ in STOP_ON},
            "window": form.checked("window"),
            "window_start": form.get("definition.send_window.start"),
            "window_end": form.get("definition.send_window.end"),
            "window_days": form.getall("definition.send_window.days"),
            "number_id": form.get("definition.number_id"),
        }
        project_id = project_of(request)
        window: SendWindow | None = None
        try:
            if options["window"]:
                raw_window = {
                    "start": options["window_start"],
                    "end": options["window_end"],
                    "days": options["window_days"],
                }
                try:
                    window = validate_window(
                        msgspec.convert(raw_window, SendWindow), "definition.send_window"
                    )
                except msgspec.ValidationError as exc:
                    raise _Refused(validation_error(exc, "definition.send_window")) from None
            with transaction(runtime_of(request)) as conn:
                current = definition_of(sequences.get_sequence(conn, project_id, sequence_id))
                changes = {
                    "reentry": options["reentry"],
                    "stop_on": options["stop_on"],
                    "send_window": msgspec.to_builtins(window),
                    "number_id": options["number_id"] or None,
                }
                try:
                    updated = msgspec.convert(msgspec.to_builtins(current) | changes, Definition)
                except msgspec.ValidationError as exc:
                    raise _Refused(validation_error(exc, "definition")) from None
                sequences.update_sequence(conn, project_id, sequence_id, SequenceUpdate(definition=updated))
        except _Refused as refused:
            return builder_page(request, sequence_id, errors=refused.errors, status=422, options=options)
        except FollowupsError as exc:
            if isinstance(exc, NotFound) and exc.field == "sequence_id":
                raise
            return builder_page(
                request, sequence_id, errors=error_of(exc), status=status_of(exc), options=options
            )
        return see_other(f"/app/sequences/{sequence_id}", notice="saved")

    @post("/{sequence_id:uuid}/publish", sync_to_thread=True)
    def publish(self, request: Request[Any, Any, Any], sequence_id: FromPath[uuid.UUID]) -> Response[str]:
        runtime = runtime_of(request)
        try:
            with transaction(runtime) as conn:
                sequences.publish_sequence(conn, project_of(request), sequence_id, now=runtime.clock.now())
        except FollowupsError as exc:
            if isinstance(exc, NotFound) and exc.field == "sequence_id":
                raise
            return builder_page(request, sequence_id, errors=error_of(exc), status=status_of(exc))
        return see_other(f"/app/sequences/{sequence_id}", notice="published")

    @post("/{sequence_id:uuid}/pause", sync_to_thread=True)
    def pause(self, request: Request[Any, Any, Any], sequence_id: FromPath[uuid.UUID]) -> Response[str]:
        return self._change(request, sequence_id, "pause", "paused")

    @post("/{sequence_id:uuid}/resume", sync_to_thread=True)
    def resume(self, request: Request[Any, Any, Any], sequence_id: FromPath[uuid.UUID]) -> Response[str]:
        return self._change(request, sequence_id, "resume", "resumed")

    @post("/{sequence_id:uuid}/archive", sync_to_thread=True)
    def archive(self, request: Request[Any, Any, Any], sequence_id: FromPath[uuid.UUID]) -> Response[str]:
        return self._change(request, sequence_id, "archive", "archived")

    def _change(
        self, request: Request[Any, Any, Any], sequence_id: uuid.UUID, action: str, notice: str
    ) -> Response[str]:
        runtime = runtime_of(request)
        try:
            with transaction(runtime) as conn:
                sequences.change_sequence_status(
                    conn, project_of(request), sequence_id, action, now=runtime.clock.now()
                )
        except FollowupsError as exc:
            if isinstance(exc, NotFound):
                raise
            return builder_page(request, sequence_id, errors=error_of(exc), status=status_of(exc))
        return see_other(f"/app/sequences/{sequence_id}", notice=notice)


class _Refused(Exception):
    """A form the domain's types refused, with its errors."""

    def __init__(self, errors: FormErrors) -> None:
        super().__init__("refused")
        self.errors = errors


def _options_of(definition: Definition) -> dict[str, Any]:
    window = definition.send_window
    return {
        "reentry": definition.reentry,
        "stop_on": msgspec.to_builtins(definition.stop_on),
        "window": window is not None,
        "window_start": window.start if window else "09:00",
        "window_end": window.end if window else "18:00",
        "window_days": list(window.days) if window else list(WEEKDAYS[:5]),
        "number_id": str(definition.number_id) if definition.number_id else "",
    }
