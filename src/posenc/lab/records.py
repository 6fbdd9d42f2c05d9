"""The shape of a run record (``runs/<encoding>-s<seed>.json``), checked where it is read.

A resumed sweep merges the records it finds into its report; a damaged or hand-edited
record (a missing ``label``, a result without its metric, an ``environment`` that is not
an object, truncated JSON) is refused in one line that names the file and the field
(``rows[0].results['32'].ppl``), before the statistics, tables or figures read it.

A shape is a type (``str``, ``int``, ``float`` for any number, ``bool``, ``None``), a
tuple of shapes (any of them), a one-element list (a list of that shape), ``Each``
(an object whose values have a shape), ``Pairs`` (a curve of ``[step, value]``) or a dict
of field shapes, a key starting with ``?`` being optional.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["check_header", "check_run"]


@dataclass(frozen=True)
class Each:
    """An object (string keys) whose every value has ``shape``."""

    shape: object


class _Pairs:
    """A list of ``[number, number]`` (a curve of steps and values)."""


Pairs = _Pairs()
_NUMBERS = [float]
_SCALAR = (str, int, float, bool, None)
_HEADER = {"encoding": str, "seed": int, "status": str, "rows": list}
_TRAIN = {
    "steps": int, "?seconds": float, "?tokens_per_second": float, "?final_loss": float,
    "?curve": Pairs, "?stop": str, "?max_steps": int, "?check_every": int,
    "?learned_at": float, "?checks": Pairs, "?resumed_from": int,
    "?validation": {"?every": int, "?tokens": int, "?curve": Pairs},
}  # fmt: skip
_TEXT = {"ppl": float, "?loss": float, "?tokens": int, "?segments": _NUMBERS}
_RESULTS = {
    "ppl": {**_TEXT, "?position_loss": _NUMBERS, "?sliding": {**_TEXT, "?stride": int}},
    "accuracy": {"accuracy": float, "?token_accuracy": float, "?examples": int,
                 "?solved": _NUMBERS, "?depths": Each(float)},
}  # fmt: skip


def _run(metric: str) -> dict[str, object]:
    row = {"label": str, "kind": str, "results": Each((None, _RESULTS[metric])), "notes": Each(str)}
    return {
        **_HEADER, "rows": [row], "?identity": str, "?environment": Each(_SCALAR),
        "?weights": str, "?error": (str, None), "?learned": bool, "?steps_to_learn": (int, None),
        "?train": _TRAIN, "?seconds": float, "?cpu_seconds": float, "?parameters": int,
        "?heldout": Each(object),
    }  # fmt: skip


def _name(shape: object) -> str:
    if isinstance(shape, tuple):
        return " or ".join(_name(s) for s in shape)
    if isinstance(shape, list):
        return f"a list of {_name(shape[0])}"
    if isinstance(shape, dict | Each):
        return "an object"
    if shape is Pairs:
        return "a list of [step, value] pairs"
    if shape is None:
        return "null"
    return {str: "a string", int: "an integer", float: "a number", bool: "true or false"}.get(
        shape, "anything"
    )


def _fits(value: object, kind: object) -> bool:
    if kind is None:
        return value is None
    if kind is object:
        return True
    if kind is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)  # type: ignore[arg-type]


def _problem(value: object, shape: object, where: str) -> tuple[str, str] | None:
    """``(field, what is wrong)`` of the first field of ``value`` not of ``shape``."""
    if isinstance(shape, tuple):
        found = [_problem(value, s, where) for s in shape]
        if all(found):  # fits none: the deepest complaint of the one whose kind matches
            inner = [f for f, s in zip(found, shape, strict=True) if _kind_fits(value, s)]
            return inner[0] if inner else (where, f"must be {_name(shape)}, got {_short(value)}")
        return None
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            return where, f"must be an object, got {_short(value)}"
        for key, inner in shape.items():
            name = key.removeprefix("?")
            here = f"{where}.{name}" if where else name
            if name not in value:
                if key.startswith("?"):
                    continue
                return here, "is missing"
            found = _problem(value[name], inner, here)
            if found:
                return found
        return None
    if isinstance(shape, Each):
        if not isinstance(value, dict):
            return where, f"must be an object, got {_short(value)}"
        for key, item in value.items():
            found = _problem(item, shape.shape, f"{where}[{key!r}]")
            if found:
                return found
        return None
    if shape is Pairs:
        if not isinstance(value, list):
            return where, f"must be {_name(shape)}, got {_short(value)}"
        for index, pair in enumerate(value):
            if not (
                isinstance(pair, list) and len(pair) == 2 and all(_fits(v, float) for v in pair)
            ):
                return f"{where}[{index}]", f"must be a [step, value] pair, got {_short(pair)}"
        return None
    if isinstance(shape, list):
        if not isinstance(value, list):
            return where, f"must be {_name(shape)}, got {_short(value)}"
        for index, element in enumerate(value):
            found = _problem(element, shape[0], f"{where}[{index}]")
            if found:
                return found
        return None
    if not _fits(value, shape):
        return where, f"must be {_name(shape)}, got {_short(value)}"
    return None


def _kind_fits(value: object, shape: object) -> bool:
    """Whether ``value`` is of the container kind of ``shape`` (for the better message)."""
    if isinstance(shape, dict | Each):
        return isinstance(value, dict)
    if isinstance(shape, list) or shape is Pairs:
        return isinstance(value, list)
    return False


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _refuse(path: Path, field: str, what: str) -> ValueError:
    return ValueError(f"{str(path)!r} is a damaged lab run record: {field} {what}; move it away")


def check_header(record: object, path: Path) -> None:
    """Check the fields that say whose run ``record`` is (``encoding``, ``seed``,
    ``status``, ``rows``).

    Raises:
        ValueError: not a run record (the message names ``path`` and the field).
    """
    if not isinstance(record, dict):
        raise ValueError(
            f"{str(path)!r} is not a lab run record (a JSON object), got {_short(record)}; "
            "move it away"
        )
    found = _problem(record, _HEADER, "")
    if found:
        raise _refuse(path, *found)


def check_run(record: dict, path: Path, metric: str) -> None:
    """Check every field of a finished run's record that the report, statistics and
    figures read, with ``metric`` (``"ppl"`` or ``"accuracy"``) in every result.

    Raises:
        ValueError: the first field that is missing or of the wrong type, named with
            ``path`` (``rows[0].label is missing``).
    """
    found = _problem(record, _run(metric), "")
    if found:
        raise _refuse(path, *found)
    if record["status"] != "ok" or not {"learned", "steps_to_learn"} & set(record):
        return
    # a task's run: the report says how it was trained until learned
    if "learned" not in record:
        raise _refuse(path, "learned", "is missing")
    needed = ["steps"] + ["max_steps", "check_every", "learned_at"] * ("steps_to_learn" in record)
    missing = [key for key in needed if key not in record.get("train", {})]
    if missing:
        raise _refuse(path, f"train.{missing[0]}", "is missing")
