"""Compare several runtimes' readings of one checkpoint, field by field and layer by layer.

Shapes: ``P`` positions, ``R`` rotary dims, ``L`` layers.

The first reading that ran is the reference; every other reading is compared with it on
each layer's fields (``ROW_FIELDS``). Two values agree when equal; the frequencies
(``theta_j = angles[p, j] / positions[p]``) and the cos/sin factor when within a relative
``RTOL = 2^-20`` (both runtimes compute them in float32: rounding, not a different
parameter). A half-split layout in one reading and adjacent pairs in a GGUF of an
architecture llama.cpp runs with ``LLAMA_ROPE_TYPE_NORM`` agree: llama.cpp's converter
permutes those Q/K rows (``convert_hf_to_gguf.py``, ``LlamaModel.permute``), which
``posenc.audit.weights`` checks from the weights. A NaN row is a position that runtime does
not compute (vLLM past its cos/sin cache; its reading's note says so): both readings are
compared on the positions both compute.

The largest change of an attention score a difference causes at length ``N``, for unit
``q, k`` whose pairs all align (the worst case): with offsets ``m`` the audited positions
below ``N`` and pairs ``j`` (a pair one runtime does not rotate has ``theta = 0``, ``s = 1``),

* frequencies: ``max_{m,j} |cos(m theta1_j) - cos(m theta2_j)|``;
* cos/sin factor ``s`` (it multiplies both ``q`` and ``k``): ``max_m |s1(m)^2 - s2(m)^2|``;
* the softmax scale: ``|c1 - c2| sqrt(D)`` (``c = 1/sqrt(D)`` unless the runtime sets it);

a difference of rotated dims, pair layout, window or ALiBi has no per-score bound
without the weights: shown as ``nan``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from posenc.audit.llamacpp import ARCHITECTURES
from posenc.audit.reading import LayerPositions, Reading

__all__ = ["ROW_FIELDS", "RTOL", "Comparison", "Row", "compare"]

RTOL = 2.0**-20

#: the compared fields, in table order
ROW_FIELDS = (
    "rotates",
    "head_dim",
    "rotary_dim",
    "pairs",
    "frequencies",
    "cos/sin factor",
    "softmax_scale",
    "sliding_window",
    "alibi_max_bias",
    "extra",
)


@dataclass(frozen=True)
class Row:
    """One field: each runtime's value (of the first layer that differs, else layer 0),
    whether all agree (None: fewer than two readings ran), the layers that differ and the
    largest score change at each length."""

    field: str
    values: dict[str, str]
    agree: bool | None
    layers: str = ""
    score_change: dict[int, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Comparison:
    """The rows, the readings compared and the lengths the score changes are for."""

    rows: tuple[Row, ...]
    readings: tuple[Reading, ...]
    lengths: tuple[int, ...]

    @property
    def agree(self) -> bool:
        """Whether no row differs."""
        return all(row.agree is not False for row in self.rows)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: rows, each reading's raw fields and note, the lengths."""
        return {
            "agree": self.agree,
            "lengths": list(self.lengths),
            "rows": [
                {
                    "field": r.field,
                    "values": r.values,
                    "agree": r.agree,
                    "layers": r.layers,
                    "score_change": {str(n): _json_float(v) for n, v in r.score_change.items()},
                }
                for r in self.rows
            ],
            "runtimes": [
                {
                    "runtime": x.runtime,
                    "ran": x.ran,
                    "note": x.note,
                    "fields": x.to_dict()["fields"],
                }
                for x in self.readings
            ],
        }


def _json_float(value: float) -> float | None:
    return None if math.isnan(value) else value


def _permuted(reading: Reading) -> bool:
    return ARCHITECTURES.get(str(reading.fields.get("general.architecture"))) == "norm"


def _computed(layer: LayerPositions) -> np.ndarray:
    """``[P]`` whether the runtime computed each position (NaN rows: it did not)."""
    return np.isfinite(layer.scale) & np.isfinite(layer.angles).all(axis=1)


def _thetas(layer: LayerPositions, positions: np.ndarray, pairs: int) -> np.ndarray:
    row = int(np.flatnonzero(_computed(layer))[-1]) if _computed(layer).any() else -1
    out = np.zeros(pairs)
    out[: layer.rotary_dim // 2] = layer.angles[row] / max(int(positions[row]), 1)
    return out


def _freq_change(a: LayerPositions, b: LayerPositions, pos: np.ndarray, n: int) -> float:
    pairs = max(a.rotary_dim, b.rotary_dim) // 2
    m = pos[pos < n].astype(np.float64)[:, None]  # [P', 1]
    ta, tb = _thetas(a, pos, pairs), _thetas(b, pos, pairs)
    return float(np.max(np.abs(np.cos(m * ta) - np.cos(m * tb)), initial=0.0))


def _scale_change(a: LayerPositions, b: LayerPositions, pos: np.ndarray, n: int) -> float:
    keep = (pos < n) & _computed(a) & _computed(b)
    return float(np.max(np.abs(a.scale[keep] ** 2 - b.scale[keep] ** 2), initial=0.0))


def _softmax(layer: LayerPositions) -> float:
    return layer.softmax_scale or 1.0 / math.sqrt(layer.head_dim)


def _close(x: np.ndarray, y: np.ndarray) -> bool:
    return x.shape == y.shape and bool(np.allclose(x, y, rtol=RTOL, atol=0.0))


def _field(name: str, a: LayerPositions, b: LayerPositions, ctx: dict[str, Any]):
    """``(value of a, value of b, agree, score change per length)`` for field ``name``."""
    pos, lengths = ctx["positions"], ctx["lengths"]
    nan = dict.fromkeys(lengths, float("nan"))
    zero = dict.fromkeys(lengths, 0.0)
    if name == "frequencies":
        pairs = max(a.rotary_dim, b.rotary_dim) // 2
        ta, tb = _thetas(a, pos, pairs), _thetas(b, pos, pairs)
        same = _close(ta, tb)
        change = {n: _freq_change(a, b, pos, n) for n in lengths}
        return _show_thetas(a, pos), _show_thetas(b, pos), same, change
    if name == "cos/sin factor":
        both = _computed(a) & _computed(b)
        same = _close(a.scale[both], b.scale[both])
        return (
            _num(a.scale[_computed(a)][-1] if _computed(a).any() else math.nan),
            _num(b.scale[_computed(b)][-1] if _computed(b).any() else math.nan),
            same,
            {n: _scale_change(a, b, pos, n) for n in lengths},
        )
    if name == "softmax_scale":
        ca, cb = _softmax(a), _softmax(b)
        same = math.isclose(ca, cb, rel_tol=RTOL)
        return (
            _num(ca),
            _num(cb),
            same,
            dict.fromkeys(lengths, abs(ca - cb) * math.sqrt(a.head_dim)),
        )
    va, vb = _plain(name, a), _plain(name, b)
    same = va == vb or (name == "pairs" and ctx["permuted"] and {va, vb} == {"half", "adjacent"})
    return str(va), str(vb), same, zero if same else nan


def _plain(name: str, layer: LayerPositions) -> Any:
    value = getattr(layer, name)
    return dict(value) if name == "extra" else value


def _num(x: float) -> str:
    return f"{float(x):.6g}"


def _show_thetas(layer: LayerPositions, pos: np.ndarray) -> str:
    if not layer.rotates:
        return "-"
    t = _thetas(layer, pos, layer.rotary_dim // 2)
    return f"{t[0]:.6g} .. {t[-1]:.6g}"


def _layer_ranges(indices: Sequence[int]) -> str:
    if not indices:
        return ""
    spans, start = [], indices[0]
    for prev, cur in zip(indices, [*indices[1:], None], strict=True):
        if cur != prev + 1:
            spans.append(str(start) if start == prev else f"{start}-{prev}")
            start = cur
    return ",".join(spans)


def _row(name: str, ran: list[Reading], ctx: Callable[[Reading], dict[str, Any]]) -> Row:
    ref = ran[0]
    lengths = ctx(ref)["lengths"]
    values = {ref.runtime: ""}
    differing: list[int] = []
    change = dict.fromkeys(lengths, 0.0)
    for other in ran[1:]:
        c = ctx(other)
        shown = None
        for i, (a, b) in enumerate(zip(ref.layers, other.layers, strict=True)):
            va, vb, same, delta = _field(name, a, b, c)
            change = {n: max(change[n], delta[n]) for n in lengths}
            if not same and i not in differing:
                differing.append(i)
            if shown is None or (not same and shown[2]):
                shown = (va, vb, same)
        values[ref.runtime] = values[ref.runtime] or shown[0]
        values[other.runtime] = shown[1]
    differing.sort()
    return Row(name, values, not differing, _layer_ranges(differing), change)


def compare(readings: Sequence[Reading], lengths: Sequence[int]) -> Comparison:
    """Compare ``readings`` (the first that ran is the reference) at ``lengths``.

    Raises:
        ValueError: readings with different positions or layer counts (the input
            contract of ``posenc.audit.reading``), or no lengths.
    """
    if not lengths:
        raise ValueError("compare needs at least one length")
    ran = [r for r in readings if r.ran]
    for r in ran[1:]:
        if not np.array_equal(r.positions, ran[0].positions):
            raise ValueError(f"{r.runtime} was read at other positions than {ran[0].runtime}")
        if len(r.layers) != len(ran[0].layers):
            raise ValueError(
                f"{r.runtime} has {len(r.layers)} layers, {ran[0].runtime} {len(ran[0].layers)}"
            )
    lengths = tuple(int(n) for n in lengths)

    def ctx(r: Reading) -> dict[str, Any]:
        return {"positions": r.positions, "lengths": lengths, "permuted": _permuted(r)}

    rows = []
    for name in ROW_FIELDS:
        if len(ran) < 2:
            rows.append(Row(name, {r.runtime: "" for r in ran}, None))
            continue
        row = _row(name, ran, ctx)
        rows.append(row)
    not_run = {r.runtime: "not run" for r in readings if not r.ran}
    rows = [Row(r.field, {**r.values, **not_run}, r.agree, r.layers, r.score_change) for r in rows]
    return Comparison(tuple(rows), tuple(readings), lengths)
