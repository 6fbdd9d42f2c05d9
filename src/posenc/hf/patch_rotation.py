"""How ``posenc.hf.patch`` finds and replaces the rotation a transformers model calls.

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head_dim, ``R`` rotary dim. An attention
module of a transformers modeling file rotates q and k by calling one of that file's
module-level functions (``apply_rotary_pos_emb``, ``apply_rotary_pos_emb_interleave``,
``apply_rotary_emb`` ...) on the ``position_embeddings`` its decoder layer hands it. Releases
change those functions (argument order, one tensor or two, complex ``freqs_cis``) and wrap
``forward`` in decorators, so nothing here relies on a name list or on ``forward``'s code:

* ``rotation_methods``: the methods of a module's class (decorators unwrapped) whose code
  names a rotation function of the class's modeling module;
* ``measure_rotation``: calls the real function once on the model's own tables and finds the
  posenc layout that reproduces it (Su et al. 2021, "RoFormer", eq. 34: pairs ``(i, i + R/2)``,
  pairs ``(2i, 2i + 1)``, or interleaved features rotated as halves, DeepSeek-V3's
  ``rope_interleave``), raising when none does;
* ``Rotation``: the replacement, called with the real function's arguments and posenc's tables;
* ``rebind``: a copy of a (possibly decorated) method whose modeling-module globals map the
  rotation names to replacements, wrappers rebuilt around it, nothing global changed.
"""

from __future__ import annotations

import inspect
import re
import sys
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from posenc.encodings.rotary.apply import apply_rope
from posenc.encodings.rotary.rope_op import compute_dtype

__all__ = [
    "LAYOUTS",
    "TENSOR_ARGUMENTS",
    "Rotation",
    "TableFormat",
    "measure_rotation",
    "rebind",
    "rotation_methods",
]

ROTATION_NAME = re.compile(r"^apply_rotary(_pos)?_emb(_interleave)?$")
LAYOUTS = ("half", "interleaved", "deinterleave")
#: the argument names of the tensors a rotation function rotates, across releases
TENSOR_ARGUMENTS = ("q", "k", "x", "tensor", "xq", "xk")
_TABLES = (("cos", "sin"), ("freqs_cis",))


def _cell(cell: types.CellType) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


def rotation_methods(cls: type) -> dict[str, tuple[str, ...]]:
    """``{method name: rotation function names}`` for the methods of ``cls`` (and of its
    bases from modeling files) whose code calls a rotation function of their module."""
    found: dict[str, tuple[str, ...]] = {}
    for klass in cls.__mro__:
        module = sys.modules.get(klass.__module__)
        if module is None or not klass.__module__.startswith("transformers."):
            continue
        rotations = {
            name
            for name, value in vars(module).items()
            if ROTATION_NAME.match(name) and inspect.isfunction(value)
        }
        for name, value in vars(klass).items():
            if name in found or not inspect.isfunction(value):
                continue
            names = rotations.intersection(inspect.unwrap(value).__code__.co_names)
            if names:
                found[name] = tuple(sorted(names))
    return found


def rebind(fn: types.FunctionType, replacements: Mapping[str, Callable]) -> types.FunctionType:
    """``fn`` with ``replacements`` in its innermost globals; each decorator's wrapper is
    rebuilt with its closure cell pointing at the rebuilt inner function."""
    inner = getattr(fn, "__wrapped__", None)
    cells = fn.__closure__ or ()
    if inner is not None and any(_cell(c) is inner for c in cells):
        new_inner = rebind(inner, replacements)
        closure = tuple(types.CellType(new_inner) if _cell(c) is inner else c for c in cells)
        new = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, closure)
        new.__dict__.update(fn.__dict__)
        new.__wrapped__ = new_inner
    else:
        namespace = {**fn.__globals__, **replacements}
        new = types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__, cells)
        new.__dict__.update(fn.__dict__)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__qualname__ = fn.__qualname__
    new.__doc__ = fn.__doc__
    return new


@dataclass(frozen=True)
class TableFormat:
    """How a model's ``rotary_emb`` hands out one table, measured on the module itself.

    A patched model hands out its tables in this format, and ``Rotation`` reads them back,
    so an attention module rotates correctly whichever side of a ``patch``/``unpatch`` its
    forward's tables came from (a forward running in another thread at that moment).

    Args:
        width: ``"half"`` (one value per pair, ``[B, T, R/2]``), ``"cat"`` (the pairs'
            values twice, ``cat(t, t)``: ``[B, T, R]``) or ``"repeat"`` (each value twice
            in a row, ``repeat_interleave(t, 2)``).
        dtype: the tables' dtype, or None where it is the input's (``cos.to(x.dtype)``).
    """

    width: str = "half"
    dtype: torch.dtype | None = None

    def expand(self, table: Tensor, x_dtype: torch.dtype) -> Tensor:
        """posenc's ``[B, T, R/2]`` table in this format."""
        table = table.to(x_dtype if self.dtype is None else self.dtype)
        if self.width == "cat":
            return torch.cat((table, table), dim=-1)
        return table.repeat_interleave(2, dim=-1) if self.width == "repeat" else table

    def reduce(self, table: Tensor) -> Tensor:
        """A table of this format as posenc's ``[B, T, R/2]`` (a view)."""
        if self.width == "cat":
            return table[..., : table.shape[-1] // 2]
        return table[..., ::2] if self.width == "repeat" else table


def measure_tables(real: Tensor, cos: Tensor, real_16bit: Tensor) -> TableFormat:
    """The ``TableFormat`` of a model's cos table.

    Args:
        real: the model's cos table for positions ``[[0, 1, 2]]`` and a float32 input.
        cos: posenc's for the same positions, ``[1, 3, R/2]``.
        real_16bit: the model's cos table for a bfloat16 input.

    Raises:
        ValueError: a width that is neither ``R/2`` nor ``R``.
    """
    half = cos.shape[-1]
    dtype = None if real_16bit.dtype == torch.bfloat16 else real_16bit.dtype
    if real.shape[-1] == half:
        return TableFormat("half", dtype)
    if real.shape[-1] != 2 * half:
        raise ValueError(
            f"its rotary_emb hands out tables of width {real.shape[-1]}, neither the "
            f"{half} rotated pairs nor twice as many"
        )
    gaps = {
        width: float((real.float() - TableFormat(width).expand(cos, torch.float32)).abs().max())
        for width in ("cat", "repeat")
    }
    return TableFormat(min(gaps, key=gaps.__getitem__), dtype)


@dataclass
class Rotation:
    """posenc's stand-in for one rotation function (its signature, posenc's rotation).

    Args:
        signature: the real function's signature (arguments are bound by name).
        layout: ``"half"``, ``"interleaved"`` or ``"deinterleave"`` (module docstring).
        heads_axis: where the heads axis of q/k is when the function has no
            ``unsqueeze_dim`` (1: ``[B, H, T, D]``; 2: ``[B, T, H, D]``).
        sign: -1 where the function turns pairs by ``-theta`` (NanoChat's ``rotate_half``).
        tables: the format of the cos/sin tables it is handed (read back to ``[B, T, R/2]``).
    """

    signature: inspect.Signature
    layout: str
    heads_axis: int = 1
    sign: int = 1
    tables: TableFormat = field(default_factory=TableFormat)
    calls: int = field(default=0, compare=False)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        values = bound.arguments
        # once for all the tensors rotated: contiguous, in the dtype the rotation computes in
        cos, sin = (
            self.tables.reduce(t).to(compute_dtype(t.dtype)).contiguous() for t in _tables(values)
        )
        sin = sin if self.sign == 1 else -sin
        axis = values.get("unsqueeze_dim", self.heads_axis)
        self.calls += 1
        names = [n for n in values if n in TENSOR_ARGUMENTS]
        out = [
            None if values[n] is None else _rotate(values[n], cos, sin, axis, self.layout)
            for n in names
        ]
        return out[0] if len(out) == 1 else tuple(out)


def _tables(values: Mapping[str, Any]) -> tuple[Tensor, Tensor]:
    if "freqs_cis" in values:
        freqs = values["freqs_cis"]
        return freqs.real, freqs.imag
    return values["cos"], values["sin"]


def _rotate(x: Tensor, cos: Tensor, sin: Tensor, axis: int, layout: str) -> Tensor:
    """``x`` rotated in ``layout`` by posenc's tables ``[B, T, R/2]``; heads at ``axis``."""
    if axis == 2:
        x = x.transpose(1, 2)
    if layout == "deinterleave":  # (x0, x1, x2, x3 ...) -> (x0, x2, ..., x1, x3, ...)
        shape = x.shape
        x = x.unflatten(-1, (shape[-1] // 2, 2)).transpose(-1, -2).reshape(shape)
    out = apply_rope(x, cos, sin, interleaved=layout == "interleaved")
    return out.transpose(1, 2) if axis == 2 else out


def _call_real(
    fn: Callable, signature: inspect.Signature, q: Tensor, k: Tensor, tables: Any, order: str
) -> Any:
    names = list(signature.parameters)
    args: dict[str, Any] = {}
    tensors = [n for n in names if n in TENSOR_ARGUMENTS]
    for name, value in zip(tensors, (q, k), strict=False):
        args[name] = value
    table_names = next((t for t in _TABLES if all(n in names for n in t)), None)
    if table_names is None:
        raise ValueError(f"no cos/sin or freqs_cis arguments in {signature}")
    if len(table_names) == 1:
        args[table_names[0]] = tables
    elif order == "sin_cos":  # GPT-J's rotary_emb hands out (sin, cos)
        args["sin"], args["cos"] = tables
    else:
        args["cos"], args["sin"] = tables
    return fn(**args)


def measure_rotation(
    fn: Callable,
    real_tables: Any,
    cos: Tensor,
    sin: Tensor,
    *,
    arrangement: str,
    precision: torch.dtype = torch.float32,
    table_format: TableFormat | None = None,
) -> Rotation:
    """The ``Rotation`` that reproduces ``fn`` on the model's own tables.

    Args:
        fn: the modeling file's rotation function.
        real_tables: what the model's ``rotary_emb`` returned for positions ``[[0, 1, 2]]``,
            in the order the attention module unpacks it (``(cos, sin)``, ``(sin, cos)`` or
            a complex ``freqs_cis``).
        cos, sin: posenc's tables for the same positions, ``[1, 3, R/2]`` (float32).
        arrangement: ``"cos_sin"``, ``"sin_cos"`` or ``"complex"`` (one ``freqs_cis``).
        precision: the coarsest floating dtype of the rotary module's buffers (its
            ``inv_freq`` is bfloat16 after ``model.to(torch.bfloat16)``): sets the tolerance.
        table_format: the format of the tables the rotation is handed (``measure_tables``; None:
            posenc's own ``[B, T, R/2]``).

    Raises:
        ValueError: no posenc layout reproduces ``fn`` (its name and the error given).
    """
    signature = inspect.signature(fn)
    width = 2 * cos.shape[-1]
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, cos.shape[-2], width, generator=generator, device="cpu")
    k = torch.randn(1, 2, cos.shape[-2], width, generator=generator, device="cpu")
    if arrangement != "complex":
        dtypes = [precision, real_tables[0].dtype]
        tables = tuple(t.to("cpu", torch.float32) for t in real_tables)
    else:
        dtypes = [precision, real_tables.real.dtype]
        tables = real_tables.to("cpu", torch.complex64)
    eps = max(torch.finfo(d).eps for d in dtypes if d.is_floating_point)
    tolerance = 16 * eps * cos.shape[-2] * float(q.abs().max()) * max(1.0, float(cos.abs().max()))
    errors = []
    for axis in (1, 2):
        qa, ka = (q, k) if axis == 1 else (q.transpose(1, 2), k.transpose(1, 2))
        try:
            expected = _call_real(fn, signature, qa, ka, tables, arrangement)
        except Exception as exc:  # a layout the function cannot take
            errors.append(f"{type(exc).__name__}: {exc}")
            continue
        first = expected[0] if isinstance(expected, tuple) else expected
        gaps = {}
        for layout in LAYOUTS:
            for sign in (1, -1):  # -1: pairs turn by -theta (NanoChat)
                got = _rotate(qa, cos.float(), sign * sin.float(), axis, layout)
                if got.shape == first.shape:
                    gaps[(layout, sign)] = float((got - first).abs().max())
        ranked = sorted(gaps, key=gaps.__getitem__)
        # the best layout must be within the tolerance and far ahead of the next one
        alone = len(ranked) == 1 or gaps[ranked[1]] > 4 * max(gaps[ranked[0]], tolerance / 64)
        if ranked and gaps[ranked[0]] <= tolerance and alone:
            layout, sign = ranked[0]
            return Rotation(signature, layout, axis, sign, table_format or TableFormat())
        errors.append(f"heads at axis {axis}: no layout of {LAYOUTS} matches ({gaps})")
    raise ValueError(f"{fn.__name__}{signature}: {'; '.join(errors)}")
