"""What changed between two versions of a sequence: step by step and field by field."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class Change:
    #: Where: ``step 2 · text``, ``send window``, ``step 3`` (a whole step added or removed).
    where: str
    kind: Literal["added", "removed", "changed"]
    before: str | None
    after: str | None


def _shown(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def _flatten(value: Any, path: str, out: dict[str, Any]) -> None:
    if isinstance(value, dict) and (value or not path):
        for key, item in value.items():
            _flatten(item, f"{path}.{key}" if path else key, out)
    else:
        out[path] = value


def _label(path: str) -> str:
    return path.replace("_", " ").replace(".", " · ")


def _compare(before: dict[str, Any], after: dict[str, Any], prefix: str, changes: list[Change]) -> None:
    old: dict[str, Any] = {}
    new: dict[str, Any] = {}
    _flatten(before, "", old)
    _flatten(after, "", new)
    for key in sorted(set(old) | set(new)):
        was, now = old.get(key), new.get(key)
        if was == now:
            continue
        where = f"{prefix}{_label(key)}"
        if key not in old or was is None:
            changes.append(Change(where, "added", None, _shown(now)))
        elif key not in new or now is None:
            changes.append(Change(where, "removed", _shown(was), None))
        else:
            changes.append(Change(where, "changed", _shown(was), _shown(now)))


def _step_summary(step: dict[str, Any]) -> str:
    text = step.get("text") or step.get("instructions") or ""
    return f"{step.get('kind', 'step')}: {text}"


def definition_changes(before: dict[str, Any], after: dict[str, Any]) -> list[Change]:
    """The changes from ``before`` to ``after`` (two versions' definitions), steps first."""
    changes: list[Change] = []
    old_steps: list[dict[str, Any]] = list(before.get("steps") or [])
    new_steps: list[dict[str, Any]] = list(after.get("steps") or [])
    for index in range(max(len(old_steps), len(new_steps))):
        label = f"step {index + 1}"
        if index >= len(old_steps):
            changes.append(Change(label, "added", None, _step_summary(new_steps[index])))
        elif index >= len(new_steps):
            changes.append(Change(label, "removed", _step_summary(old_steps[index]), None))
        else:
            _compare(old_steps[index], new_steps[index], f"{label} · ", changes)
    rest_before = {key: value for key, value in before.items() if key != "steps"}
    rest_after = {key: value for key, value in after.items() if key != "steps"}
    _compare(rest_before, rest_after, "", changes)
    return changes
