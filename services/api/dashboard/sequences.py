"""Sequences: the list (status, live counts), the builder (steps added, edited, reordered, removed; the
sequence's options), publish, pause / resume / archive, and the version history with what changed.

The builder edits the draft with ``update_sequence`` like ``PATCH /v1/sequences/{id}``; publishing is
``publish_sequence``, whose errors name ``definition.steps.<i>.<field>`` and are shown on that step.
"""

from __future__ import annotations

import uuid
from typing import Any

import msgspec
from litestar import Controller, Request, Response, get, post
from litestar.params import FromPath

from libs.common.core.errors import FollowupsError, InvalidInput, NotFound
from libs.common.followups import sequences, statistics
from libs.common.followups.definition import (
    Definition,
    MessageStep,
    Step,
    decode_definition,
    validate_definition,
)
from libs.common.followups.send_window import WEEKDAYS, SendWindow, validate_window
from libs.common.followups.sequences import Sequence, SequenceCreate, SequenceUpdate
from libs.common.platform import contacts, numbers
from services.api.dashboard import charts, diff
from services.api.dashboard.base import paged, project_of, query_uuid, see_other
from services.api.dashboard.forms import Form, FormErrors, anchor_time, error_of, key_values, validation_error
from services.api.dashboard.queries import project_header
from services.api.dashboard.render import page
from services.api.dashboard.step_form import (
    KINDS,
    MEDIA_KINDS,
    ONLY_IF,
    TIMINGS,
    UNIT_CHOICES,
    VARIABLES,
    StepForm,
    decode_step,
    describe,
    preview,
)
from services.api.deps import runtime_of, transaction
from services.api.problems import status_of

#: Days the daily chart of a sequence's results shows.
RESULT_DAYS = 30
STATUS_FILTERS = ("draft", "active", "paused", "archived")
REENTRY = [
    ("after_finished", "again once the previous enrollment finished"),
    ("never", "never: a contact enters once"),
    ("always", "always: a new enrollment replaces the live one"),
]
STOP_ON = [
    ("reply", "the contact replies"),
    ("human_message", "an agent writes to the contact"),
    ("opt_out", "the contact opts out"),
    ("lead_closed", "the contact's lead closes"),
    ("conversation_resolved", "the conversation is resolved"),
]


def _definition(sequence: Sequence) -> Definition:
    return decode_definition(sequence.draft)


def _step_errors(errors: FormErrors, index: int) -> FormErrors:
    """The errors about step ``index`` of the definition, named as the step form's inputs."""
    prefix = f"definition.steps.{index}"
    out = FormErrors()
    for where, message in errors.about(prefix):
        out.add(where.removeprefix(prefix).lstrip("."), message)
    return out


class SequencesController(Controller):
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
                conn, project_id, limit=51, after=query_uuid(request, "after"), status=status_filter
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
        return self._builder(request, sequence_id)

    def _builder(
        self,
        request: Request[Any, Any, Any],
        sequence_id: uuid.UUID,
        *,
        errors: FormErrors | None = None,
        status: int = 200,
        options: dict[str, Any] | None = None,
        name: str | None = None,
    ) -> Response[str]:
        project_id = project_of(request)
        with transaction(runtime_of(request)) as conn:
            sequence = sequences.get_sequence(conn, project_id, sequence_id)
            found_numbers = numbers.list_numbers(conn, project_id, limit=200)
            counts = statistics.sequence_counts(conn, project_id, [sequence_id])[sequence_id]
        definition = _definition(sequence)
        errors = errors or FormErrors()
        return page(
            request,
            "sequences/builder.html",
            status=status,
            title=sequence.name,
            sequence=sequence,
            counts=counts,
            steps=[(describe(step), _step_errors(errors, i)) for i, step in enumerate(definition.steps)],
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

    @post("/{sequence_id:uuid}/rename", sync_to_thread=True)
    def rename(self, request: Request[Any, Any, Any], sequence_id: FromPath[uuid.UUID]) -> Response[str]:
        name = Form.of(request).get("name")
        try:
            with transaction(runtime_of(request)) as conn:
                sequences.update_sequence(conn, project_of(request), sequence_id, SequenceUpdate(name=name))
        except FollowupsError as exc:
            if isinstance(exc, NotFound):
                raise
            return self._builder(request, sequence_id, errors=error_of(exc), status=status_of(exc), name=name)
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
                current = _definition(sequences.get_sequence(conn, project_id, sequence_id))
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
            return self._builder(request, sequence_id, errors=refused.errors, status=422, options=options)
        except FollowupsError as exc:
            if isinstance(exc, NotFound) and exc.field == "sequence_id":
                raise
            return self._builder(
                request, sequence_id, errors=error_of(exc), status=status_of(exc), options=options
            )
        return see_other(f"/app/sequences/{sequence_id}", notice="saved")

    @post("/{sequence_id:uuid}/publish", sync_to_thread=True)
    def publish(self, request: Request[Any, Any, Any], sequence_id: FromPath[uuid.UUID]) -> Response[str]:
        try:
            with transaction(runtime_of(request)) as conn:
                sequences.publish_sequence(conn, project_of(request), sequence_id)
        except FollowupsError as exc:
            if isinstance(exc, NotFound) and exc.field == "sequence_id":
                raise
            return self._builder(request, sequence_id, errors=error_of(exc), status=status_of(exc))
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
            return self._builder(request, sequence_id, errors=error_of(exc), status=status_of(exc))
        return see_other(f"/app/sequences/{sequence_id}", notice=notice)

    # --- steps -----------------------------------------------------------------------------------------

    @get("/{sequence_id:uuid}/steps/new", sync_to_thread=True)
    def new_step(self, request: Request[Any, Any, Any], sequence_id: FromPath[uuid.UUID]) -> Response[str]:
        with transaction(runtime_of(request)) as conn:
            sequence = sequences.get_sequence(conn, project_of(request), sequence_id)
        index = len(_definition(sequence).steps)
        form = StepForm.preset(request.query_params.get("kind") or "message", index)
        return self._step_page(request, sequence, index, form, FormErrors(), new=True)

    @get("/{sequence_id:uuid}/steps/{index:int}", sync_to_thread=True)
    def edit_step(
        self, request: Request[Any, Any, Any], sequence_id: FromPath[uuid.UUID], index: FromPath[int]
    ) -> Response[str]:
        with transaction(runtime_of(request)) as conn:
            sequence = sequences.get_sequence(conn, project_of(request), sequence_id)
        steps = _definition(sequence).steps
        if not 0 <= index < len(steps):
            raise NotFound("step not found", field="index")
        return self._step_page(
            request, sequence, index, StepForm.of_step(steps[index]), FormErrors(), new=False
        )

    @post("/{sequence_id:uuid}/steps/new", sync_to_thread=True)
    def add_step(self, request: Request[Any, Any, Any], sequence_id: FromPath[uuid.UUID]) -> Response[str]:
        return self._save_step(request, sequence_id, None)

    @post("/{sequence_id:uuid}/steps/{index:int}", sync_to_thread=True)
    def save_step(
        self, request: Request[Any, Any, Any], sequence_id: FromPath[uuid.UUID], index: FromPath[int]
    ) -> Response[str]:
        return self._save_step(request, sequence_id, index)

    @post("/{sequence_id:uuid}/steps/{index:int}/move", sync_to_thread=True)
    def move_step(
        self, request: Request[Any, Any, Any], sequence_id: FromPath[uuid.UUID], index: FromPath[int]
    ) -> Response[str]:
        to = index - 1 if Form.of(request).get("direction") == "up" else index + 1

        def move(steps: list[Any]) -> None:
            if not (0 <= index < len(steps) and 0 <= to < len(steps)):
                raise NotFound("step not found", field="index")
            steps[index], steps[to] = steps[to], steps[index]

        return self._edit_steps(request, sequence_id, move)

    @post("/{sequence_id:uuid}/steps/{index:int}/remove", sync_to_thread=True)
    def remove_step(
        self, request: Request[Any, Any, Any], sequence_id: FromPath[uuid.UUID], index: FromPath[int]
    ) -> Response[str]:
        def remove(steps: list[Any]) -> None:
            if not 0 <= index < len(steps):
                raise NotFound("step not found", field="index")
            del steps[index]

        return self._edit_steps(request, sequence_id, remove)

    def _edit_steps(
        self, request: Request[Any, Any, Any], sequence_id: uuid.UUID, change: Any
    ) -> Response[str]:
        project_id = project_of(request)
        try:
            with transaction(runtime_of(request)) as conn:
                definition = _definition(sequences.get_sequence(conn, project_id, sequence_id))
                steps = list(definition.steps)
                change(steps)
                sequences.update_sequence(
                    conn,
                    project_id,
                    sequence_id,
                    SequenceUpdate(definition=msgspec.structs.replace(definition, steps=steps)),
                )
        except FollowupsError as exc:
            if isinstance(exc, NotFound):
                raise
            return self._builder(request, sequence_id, errors=error_of(exc), status=status_of(exc))
        return see_other(f"/app/sequences/{sequence_id}", notice="saved")

    def _save_step(
        self, request: Request[Any, Any, Any], sequence_id: uuid.UUID, index: int | None
    ) -> Response[str]:
        project_id = project_of(request)
        form = Form.of(request)
        step_form = StepForm.of_form(form)
        with transaction(runtime_of(request)) as conn:
            sequence = sequences.get_sequence(conn, project_id, sequence_id)
        definition = _definition(sequence)
        new = index is None
        position = len(definition.steps) if index is None else index
        if not 0 <= position <= len(definition.steps) or (not new and position == len(definition.steps)):
            raise NotFound("step not found", field="index")
        if form.get("_op") == "refresh":  # the kind changed: draw the form again, save nothing
            return self._step_page(request, sequence, position, step_form, FormErrors(), new=new)
        errors = FormErrors()
        payload = step_form.payload(errors)
        step = None
        if not errors:
            try:
                step = decode_step(payload)
                # the step's own checks, at its place (earlier steps stand in as valid ones)
                stand_ins: list[Step] = [MessageStep(text="-") for _ in range(position)]
                validate_definition(Definition(steps=[*stand_ins, step]))
            except msgspec.ValidationError as exc:
                errors = validation_error(exc)
            except InvalidInput as exc:
                errors = _step_errors(error_of(exc), position)
        if errors or step is None:
            return self._step_page(request, sequence, position, step_form, errors, new=new, status=422)
        if form.get("_op") == "preview":
            return self._step_page(request, sequence, position, step_form, errors, new=new, step=step)
        steps = list(definition.steps)
        if new:
            steps.append(step)
        else:
            steps[position] = step
        try:
            with transaction(runtime_of(request)) as conn:
                sequences.update_sequence(
                    conn,
                    project_id,
                    sequence_id,
                    SequenceUpdate(definition=msgspec.structs.replace(definition, steps=steps)),
                )
        except FollowupsError as exc:
            if isinstance(exc, NotFound) and exc.field == "sequence_id":
                raise
            errors = _step_errors(error_of(exc), position)
            errors = errors or error_of(exc)
            return self._step_page(
                request, sequence, position, step_form, errors, new=new, status=status_of(exc)
            )
        return see_other(f"/app/sequences/{sequence_id}", notice="saved")

    def _step_page(
        self,
        request: Request[Any, Any, Any],
        sequence: Sequence,
        index: int,
        step_form: StepForm,
        errors: FormErrors,
        *,
        new: bool,
        status: int = 200,
        step: Any = None,
    ) -> Response[str]:
        project_id = project_of(request)
        form = Form.of(request)
        contact_id = form.get("preview_contact") or request.query_params.get("contact") or ""
        variables_text = form.get("preview_variables")
        anchor_text = form.get("preview_anchor")
        result = None
        preview_errors = FormErrors()
        with transaction(runtime_of(request)) as conn:
            found = contacts.list_contacts(conn, project_id, limit=200)
            header = project_header(conn, project_id)
            if step is not None and contact_id:
                try:
                    contact = contacts.get_contact(conn, project_id, uuid.UUID(contact_id))
                except (ValueError, NotFound):
                    preview_errors.add("preview_contact", "choose one of the project's contacts")
                    contact = None
                variables = key_values(variables_text, "preview_variables", preview_errors)
                anchor = anchor_time(anchor_text, preview_errors, "preview_anchor")
                if contact is not None and not preview_errors:
                    result = preview(
                        step,
                        contact=contact,
                        variables=variables,
                        anchor_at=anchor,
                        project_timezone=header.timezone,
                    )
            elif step is not None:
                preview_errors.add("preview_contact", "choose a contact to preview the step for")
        all_errors = FormErrors(errors.items + preview_errors.items)
        return page(
            request,
            "sequences/step.html",
            status=status,
            title=("New step" if new else f"Step {index + 1}") + f" · {sequence.name}",
            sequence=sequence,
            index=index,
            new=new,
            form=step_form,
            errors=all_errors,
            kinds=KINDS,
            timings=TIMINGS,
            only_if=ONLY_IF,
            media_kinds=MEDIA_KINDS,
            units=UNIT_CHOICES,
            weekdays=WEEKDAYS,
            variables=VARIABLES,
            contacts=[("", "choose…")] + [(str(c.id), c.name or c.phone or str(c.id)) for c in found],
            preview_contact=contact_id,
            preview_variables=variables_text,
            preview_anchor=anchor_text,
            result=result,
        )

    # --- versions --------------------------------------------------------------------------------------

    @get("/{sequence_id:uuid}/versions", sync_to_thread=True)
    def versions(self, request: Request[Any, Any, Any], sequence_id: FromPath[uuid.UUID]) -> Response[str]:
        project_id = project_of(request)
        with transaction(runtime_of(request)) as conn:
            sequence = sequences.get_sequence(conn, project_id, sequence_id)
            found = sequences.list_versions(conn, project_id, sequence_id)
        by_number = {v.version: v for v in found}
        newer = _int(request.query_params.get("to"), found[0].version if found else None)
        older = _int(request.query_params.get("from"), newer - 1 if newer else None)
        changes = None
        if older in by_number and newer in by_number and older != newer:
            changes = diff.definition_changes(by_number[older].definition, by_number[newer].definition)
        elif newer in by_number and older == 0:
            changes = diff.definition_changes({}, by_number[newer].definition)
        return page(
            request,
            "sequences/versions.html",
            title=f"Versions · {sequence.name}",
            sequence=sequence,
            versions=found,
            older=older,
            newer=newer,
            changes=changes,
        )

    # --- results ---------------------------------------------------------------------------------------

    @get("/{sequence_id:uuid}/results", sync_to_thread=True)
    def results(self, request: Request[Any, Any, Any], sequence_id: FromPath[uuid.UUID]) -> Response[str]:
        project_id = project_of(request)
        runtime = runtime_of(request)
        with transaction(runtime) as conn:
            sequence = sequences.get_sequence(conn, project_id, sequence_id)
            stats = statistics.sequence_statistics(conn, project_id, sequence_id)
            days = statistics.daily_activity(
                conn, project_id, sequence_id, days=RESULT_DAYS, now=runtime.clock.now()
            )
        return page(
            request,
            "sequences/results.html",
            title=f"Results · {sequence.name}",
            sequence=sequence,
            stats=stats,
            days=days,
            funnel=charts.funnel(stats),
            daily=charts.daily(days),
        )


class _Refused(Exception):
    """A form the domain's types refused, with its errors."""

    def __init__(self, errors: FormErrors) -> None:
        super().__init__("refused")
        self.errors = errors


def _int(raw: str | None, default: int | None) -> int | None:
    try:
        return int(raw) if raw else default
    except ValueError:
        return default


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
