"""A sequence's steps in the builder: a step's form (added or edited, with its preview for a contact), and
steps reordered and removed. Each change rewrites the draft with ``update_sequence``; a step's errors are
shown on its form, named as its inputs (``definition.steps.<i>.<field>`` without the prefix).
"""

from __future__ import annotations

import uuid
from typing import Any

import msgspec
from litestar import Controller, Request, Response, get, post
from litestar.params import FromPath

from libs.common.core import decoding
from libs.common.core.errors import FollowupsError, InvalidInput, NotFound
from libs.common.followups import sequences
from libs.common.followups.definition import AiStep, Definition, MessageStep, Step, validate_definition
from libs.common.followups.send_window import WEEKDAYS
from libs.common.followups.sequences import Sequence, SequenceUpdate
from libs.common.platform import contacts
from services.api.dashboard.base import project_of, see_other
from services.api.dashboard.forms import Form, FormErrors, anchor_time, error_of, key_values
from services.api.dashboard.queries import project_header
from services.api.dashboard.render import page
from services.api.dashboard.sequences import builder_page, definition_of, step_errors
from services.api.dashboard.step_form import (
    AI_LISTS,
    KINDS,
    MEDIA_KINDS,
    TIMINGS,
    UNIT_CHOICES,
    VARIABLES,
    StepForm,
    only_if_choices,
    preview,
)
from services.api.deps import runtime_of, transaction
from services.api.problems import status_of


class SequenceStepsController(Controller):
    """The steps of a sequence's draft."""

    path = "/sequences"

    @get("/{sequence_id:uuid}/steps/new", sync_to_thread=True)
    def new_step(self, request: Request[Any, Any, Any], sequence_id: FromPath[uuid.UUID]) -> Response[str]:
        with transaction(runtime_of(request)) as conn:
            sequence = sequences.get_sequence(conn, project_of(request), sequence_id)
        index = len(definition_of(sequence).steps)
        form = StepForm.preset(request.query_params.get("kind") or "message", index)
        return self._step_page(request, sequence, index, form, FormErrors(), new=True)

    @get("/{sequence_id:uuid}/steps/{index:int}", sync_to_thread=True)
    def edit_step(
        self, request: Request[Any, Any, Any], sequence_id: FromPath[uuid.UUID], index: FromPath[int]
    ) -> Response[str]:
        with transaction(runtime_of(request)) as conn:
            sequence = sequences.get_sequence(conn, project_of(request), sequence_id)
        steps = definition_of(sequence).steps
        step = steps[index] if 0 <= index < len(steps) else None
        if not isinstance(step, MessageStep | AiStep):
            raise NotFound("step not found", field="index")
        return self._step_page(request, sequence, index, StepForm.of_step(step), FormErrors(), new=False)

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
                definition = definition_of(sequences.get_sequence(conn, project_id, sequence_id))
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
            return builder_page(request, sequence_id, errors=error_of(exc), status=status_of(exc))
        return see_other(f"/app/sequences/{sequence_id}", notice="saved")

    def _save_step(
        self, request: Request[Any, Any, Any], sequence_id: uuid.UUID, index: int | None
    ) -> Response[str]:
        project_id = project_of(request)
        form = Form.of(request)
        step_form = StepForm.of_form(form)
        with transaction(runtime_of(request)) as conn:
            sequence = sequences.get_sequence(conn, project_id, sequence_id)
        definition = definition_of(sequence)
        new = index is None
        position = len(definition.steps) if index is None else index
        if not 0 <= position <= len(definition.steps) or (not new and position == len(definition.steps)):
            raise NotFound("step not found", field="index")
        if form.get("_op") == "refresh":  # the kind changed: draw the form again, save nothing
            return self._step_page(request, sequence, position, step_form, FormErrors(), new=new)
        errors = FormErrors()
        payload = step_form.payload(errors)
        # every error at once: the form's numbers, the step's types, the checks of what decodes
        step, refused = decoding.salvage(payload, Step)
        errors = FormErrors(errors.items + refused)
        if step is not None:
            try:
                # the step's own checks, at its place (earlier steps stand in as valid ones)
                stand_ins: list[Step] = [MessageStep(text="-") for _ in range(position)]
                validate_definition(Definition(steps=[*stand_ins, step]))
            except InvalidInput as exc:
                named = {where for where, _ in errors.items}
                checked = step_errors(error_of(exc), position).items
                errors = FormErrors(errors.items + [(w, m) for w, m in checked if w not in named])
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
            errors = step_errors(error_of(exc), position)
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
            only_if=only_if_choices(index),
            media_kinds=MEDIA_KINDS,
            units=UNIT_CHOICES,
            weekdays=WEEKDAYS,
            variables=VARIABLES,
            ai_lists=AI_LISTS,
            contacts=[("", "choose…")] + [(str(c.id), c.name or c.phone or str(c.id)) for c in found],
            preview_contact=contact_id,
            preview_variables=variables_text,
            preview_anchor=anchor_text,
            result=result,
        )
