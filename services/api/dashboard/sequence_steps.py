"""A sequence's steps in the builder: a step's form (a sending step's, with its preview for a contact; a
branch's, a wait's or a split's, :mod:`.control_form`), added at the end or before a step (``at``) or edited,
and steps reordered and removed. Each change rewrites the draft with ``update_sequence``; a step is checked
in its place in the draft (its targets among the later steps' ids), and its errors are shown on its form,
named as its inputs (``definition.steps.<i>.<field>`` without the prefix).
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
from libs.common.followups.definition import (
    AiStep,
    BranchStep,
    Definition,
    MessageStep,
    Node,
    SplitStep,
    Step,
    WaitForReplyStep,
    validate_definition,
)
from libs.common.followups.send_window import WEEKDAYS
from libs.common.followups.sequences import Sequence, SequenceUpdate
from libs.common.platform import contacts
from services.api.dashboard.base import project_of, see_other
from services.api.dashboard.condition_form import (
    SEGMENT_ATTRIBUTE_CHOICES,
    SEGMENT_OPERATOR_CHOICES,
    VALUE_TYPES,
)
from services.api.dashboard.control_form import CONTROL_KINDS, READ_CHOICES, ControlForm, target_choices
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
        index = _position(request.query_params.get("at"), definition_of(sequence))
        kind = request.query_params.get("kind") or "message"
        if kind in CONTROL_KINDS:
            return self._control_page(
                request, sequence, index, ControlForm.preset(kind), FormErrors(), new=True
            )
        form = StepForm.preset(kind, index)
        return self._step_page(request, sequence, index, form, FormErrors(), new=True)

    @get("/{sequence_id:uuid}/steps/{index:int}", sync_to_thread=True)
    def edit_step(
        self, request: Request[Any, Any, Any], sequence_id: FromPath[uuid.UUID], index: FromPath[int]
    ) -> Response[str]:
        with transaction(runtime_of(request)) as conn:
            sequence = sequences.get_sequence(conn, project_of(request), sequence_id)
        steps = definition_of(sequence).steps
        step = steps[index] if 0 <= index < len(steps) else None
        if isinstance(step, BranchStep | WaitForReplyStep | SplitStep):
            form = ControlForm.of_step(step)
            return self._control_page(request, sequence, index, form, FormErrors(), new=False)
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
        with transaction(runtime_of(request)) as conn:
            sequence = sequences.get_sequence(conn, project_id, sequence_id)
        definition = definition_of(sequence)
        new = index is None
        position = _position(form.get("at"), definition) if index is None else index
        if not 0 <= position <= len(definition.steps) or (not new and position == len(definition.steps)):
            raise NotFound("step not found", field="index")
        if form.get("kind") in CONTROL_KINDS:
            return self._save_control(request, sequence, position, new=new)
        step_form = StepForm.of_form(form)
        if form.get("_op") == "refresh":  # the kind changed: draw the form again, save nothing
            return self._step_page(request, sequence, position, step_form, FormErrors(), new=new)
        errors = FormErrors()
        payload = step_form.payload(errors)
        # every error at once: the form's numbers, the step's types, the checks of what decodes
        step, refused = decoding.salvage(payload, Step)
        errors = FormErrors(errors.items + refused)
        if step is not None:
            errors = _checked_in_place(definition, position, new, step, errors)
        if errors or step is None:
            return self._step_page(request, sequence, position, step_form, errors, new=new, status=422)
        if form.get("_op") == "preview":
            return self._step_page(request, sequence, position, step_form, errors, new=new, step=step)
        refused_by_store = self._store(request, sequence, position, new, step)
        if refused_by_store is not None:
            errors, status = refused_by_store
            return self._step_page(request, sequence, position, step_form, errors, new=new, status=status)
        return see_other(f"/app/sequences/{sequence_id}", notice="saved")

    def _save_control(
        self, request: Request[Any, Any, Any], sequence: Sequence, position: int, *, new: bool
    ) -> Response[str]:
        """A branch, a wait or a split: a button of its form (drawn again, nothing saved), or saved."""
        form = Form.of(request)
        control = ControlForm.of_form(form)
        op = form.get("_op") or "save"
        if op != "save":
            control.apply(op)
            return self._control_page(request, sequence, position, control, FormErrors(), new=new)
        errors = FormErrors()
        payload = control.payload(errors)
        node, refused = decoding.salvage(payload, _CONTROL_TYPES[control.kind])
        errors = FormErrors(errors.items + refused)
        if node is not None:
            errors = _checked_in_place(definition_of(sequence), position, new, node, errors)
        if errors or node is None:
            return self._control_page(request, sequence, position, control, errors, new=new, status=422)
        refused_by_store = self._store(request, sequence, position, new, node)
        if refused_by_store is not None:
            errors, status = refused_by_store
            return self._control_page(request, sequence, position, control, errors, new=new, status=status)
        return see_other(f"/app/sequences/{sequence.id}", notice="saved")

    def _store(
        self, request: Request[Any, Any, Any], sequence: Sequence, position: int, new: bool, node: Node
    ) -> tuple[FormErrors, int] | None:
        """The draft with ``node`` added at ``position`` (``new``) or put in its place; the errors and the
        status when it is refused."""
        definition = definition_of(sequence)
        try:
            with transaction(runtime_of(request)) as conn:
                sequences.update_sequence(
                    conn,
                    project_of(request),
                    sequence.id,
                    SequenceUpdate(
                        definition=msgspec.structs.replace(
                            definition, steps=_placed(definition.steps, position, new, node)
                        )
                    ),
                )
        except FollowupsError as exc:
            if isinstance(exc, NotFound) and exc.field == "sequence_id":
                raise
            errors = step_errors(error_of(exc), position)
            return errors or error_of(exc), status_of(exc)
        return None

    def _control_page(
        self,
        request: Request[Any, Any, Any],
        sequence: Sequence,
        index: int,
        control: ControlForm,
        errors: FormErrors,
        *,
        new: bool,
        status: int = 200,
    ) -> Response[str]:
        layout = _placed(definition_of(sequence).steps, index, new, None)
        current = [row.to for row in control.paths] + [row.to for row in control.variants]
        current += [control.otherwise, control.on_reply, control.on_timeout]
        targets = target_choices(layout, index, None, [c for c in current if c])
        return page(
            request,
            "sequences/control_step.html",
            status=status,
            title=("New step" if new else f"Step {index + 1}") + f" · {sequence.name}",
            sequence=sequence,
            index=index,
            new=new,
            form=control,
            errors=errors,
            kinds=list(CONTROL_KINDS.items()),
            targets=targets,
            next_targets=[("", "the next step in the list"), *targets],
            reply_targets=[("", "stop the enrollment (as a reply does)"), *targets],
            read_choices=READ_CHOICES,
            winners=[("", "none yet: an experiment")]
            + [(v.name, v.name) for v in control.variants if v.name],
            units=UNIT_CHOICES,
            attributes=SEGMENT_ATTRIBUTE_CHOICES,
            operators=SEGMENT_OPERATOR_CHOICES,
            value_types=VALUE_TYPES,
        )

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
        layout = _placed(definition_of(sequence).steps, index, new, None)
        next_targets = target_choices(layout, index, "the next step in the list", [step_form.next])
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
            next_targets=next_targets,
        )


#: The struct each routing kind decodes to.
_CONTROL_TYPES: dict[str, type[BranchStep | WaitForReplyStep | SplitStep]] = {
    "branch": BranchStep,
    "wait_for_reply": WaitForReplyStep,
    "split": SplitStep,
}


def _position(raw: str | None, definition: Definition) -> int:
    """Where a new step goes: before step ``at`` (an index), else at the end."""
    count = len(definition.steps)
    return int(raw) if raw and raw.isdigit() and int(raw) <= count else count


def _placed(steps: list[Node], position: int, new: bool, node: Node | None) -> list[Node]:
    """The steps with ``node`` inserted at ``position`` (``new``) or in its place (a stand-in message when
    ``node`` is None: the list as it will be, for the targets a form offers)."""
    out = list(steps)
    placed: Node = node if node is not None else MessageStep(text="-")
    if new:
        out.insert(position, placed)
    elif node is not None:
        out[position] = placed
    return out


def _checked_in_place(
    definition: Definition, position: int, new: bool, node: Node, errors: FormErrors
) -> FormErrors:
    """``errors`` and those of the definition's checks about ``node`` in its place in the draft (the other
    steps' errors are theirs; an error already named by ``errors`` is not repeated)."""
    steps = _placed(definition.steps, position, new, node)
    for index, other in enumerate(steps):
        if node.id is not None and index != position and other.id == node.id:
            # validation names the later of the two: here it is this step's id that is taken
            errors = FormErrors([*errors.items, ("id", f"id {node.id} is already step {index + 1}'s")])
            break
    try:
        validate_definition(msgspec.structs.replace(definition, steps=steps))
    except InvalidInput as exc:
        named = {where for where, _ in errors.items}
        checked = step_errors(error_of(exc), position).items
        return FormErrors(errors.items + [(w, m) for w, m in checked if w not in named])
    return errors
