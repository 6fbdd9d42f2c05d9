"""Input validation shared by every public entry point.

Every check raises ``ValueError`` (bad value) or ``TypeError`` (bad type) with a
message that names the argument and the offending value, never ``assert``.
"""

from __future__ import annotations

import numbers

import torch
from torch import Tensor


def check_int(name: str, value: object, *, minimum: int = 1) -> int:
    """Return ``value`` as an int after checking it is an integer ``>= minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def check_bool(name: str, value: object) -> bool:
    """Return ``value`` after checking it is a ``bool`` (not a truthy string or number)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")
    return value


def check_float_dtype(name: str, dtype: object) -> torch.dtype:
    """Return ``dtype`` after checking it is a real floating-point ``torch.dtype``.

    An integer or bool dtype would round every value (slopes, sin/cos) to 0 or 1.
    """
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"{name} must be a torch.dtype, got {dtype!r} ({type(dtype).__name__})")
    if not dtype.is_floating_point:
        raise TypeError(f"{name} must be a floating-point dtype, got {dtype}")
    return dtype


def check_even(name: str, value: object) -> int:
    """Return ``value`` after checking it is a positive even integer."""
    value = check_int(name, value)
    if value % 2:
        raise ValueError(f"{name} must be even, got {value}")
    return value


def check_float(
    name: str, value: object, *, positive: bool = False, minimum: float | None = None
) -> float:
    """Return ``value`` as a finite float, optionally ``> 0`` or ``>= minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r} ({type(value).__name__})")
    value = float(value)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"{name} must be finite, got {value}")
    if positive and value <= 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_probability(name: str, value: object) -> float:
    """Return ``value`` after checking it lies in [0, 1) (a dropout rate)."""
    value = check_float(name, value, minimum=0.0)
    if value >= 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {value}")
    return value


def check_tensor(
    name: str, x: object, *, ndim: int | tuple[int, ...] | None = None, allow_meta: bool = False
) -> Tensor:
    """Check ``x`` is a real floating-point tensor with ``ndim`` dimensions.

    A tensor on the meta device (shapes only) is refused unless ``allow_meta``: the
    callers that need its values would otherwise fail inside torch.
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.device.type == "meta" and not allow_meta:
        raise ValueError(f"{name} is on the meta device (shapes only); pass a tensor with values")
    if not x.is_floating_point():  # complex too: the imaginary part would be dropped
        raise TypeError(f"{name} must be a real floating-point tensor, got dtype {x.dtype}")
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else ndim
        if x.dim() not in allowed:
            want = " or ".join(str(n) for n in allowed)
            raise ValueError(f"{name} must have {want} dimensions, got shape {tuple(x.shape)}")
    return x


def check_positions(positions: object, name: str = "positions") -> Tensor:
    """Check ``positions`` (any shape) and return them ready to use.

    Integer positions of every dtype (uint8, int16, int32, ...) come back as int64, so
    they index tables as positions (a uint8 index would otherwise read as a mask);
    float32/float64 positions must be finite. Half precision is refused: positions above
    256 are not exact in it.

    Raises:
        TypeError: not a tensor; bool, complex or half-precision dtype.
        ValueError: NaN or infinite float positions; positions on the meta device.
    """
    if not isinstance(positions, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(positions).__name__}")
    if positions.device.type == "meta":
        raise ValueError(f"{name} is on the meta device (shapes only); positions need values")
    if positions.is_complex() or positions.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer or real values, got dtype {positions.dtype}")
    if positions.dtype in (torch.float16, torch.bfloat16):
        raise TypeError(
            f"{name} must not be {positions.dtype}: positions above 256 are not exact in it; "
            "pass integer or float32/float64 positions"
        )
    if not positions.is_floating_point():
        return positions if positions.dtype == torch.int64 else positions.to(torch.int64)
    if (
        positions.device.type != "meta"
        and not torch.compiler.is_compiling()
        and not bool(torch.isfinite(positions).all())
    ):
        bad = positions[~torch.isfinite(positions)][0].item()
        raise ValueError(f"{name} must be finite, got {bad}")
    return positions


def resolve_positions(
    positions: Tensor | None,
    seq_len: int,
    *,
    batch: int | None = None,
    device: torch.device | str | None = None,
    name: str = "positions",
) -> Tensor:
    """Return explicit positions ``[T]`` or ``[B, T]`` for a sequence of ``seq_len``.

    ``None`` means ``arange(seq_len)``. Integer and floating positions are accepted
    (floating positions serve interpolation); a ``[B, T]`` tensor must match
    ``batch`` when it is given. Positions are never cast to a low-precision dtype.
    """
    if positions is None:
        return torch.arange(seq_len, device=device)
    positions = check_positions(positions, name)
    if positions.dim() not in (1, 2) or positions.shape[-1] != seq_len:
        raise ValueError(
            f"{name} must have shape [T] or [B, T] with T = {seq_len}, "
            f"got shape {tuple(positions.shape)}"
        )
    if positions.dim() == 2 and batch is not None and positions.shape[0] not in (1, batch):
        raise ValueError(
            f"{name} has batch size {positions.shape[0]}, but the input has batch size {batch}"
        )
    return positions


def float_positions(positions: Tensor, dtype: torch.dtype, name: str = "positions") -> Tensor:
    """``positions`` (from ``check_positions``) in the floating ``dtype``, integers exact.

    An integer beyond ``+-2 / eps`` of ``dtype`` (``2**53`` in float64, ``2**24`` in
    float32) rounds to a neighbour, so neighbouring positions would share one angle or
    one row. On the CPU they are refused; on an accelerator and under ``torch.compile``
    they become NaN instead (refusing would read the positions back to the host on every
    call). Float positions are converted as they are.

    Raises:
        ValueError: an integer position beyond the limit on the CPU (named with the limit).
        TypeError: a non-floating ``dtype``.
    """
    dtype = check_float_dtype("dtype", dtype)
    out = positions.to(dtype)
    if positions.is_floating_point() or not positions.numel() or positions.device.type == "meta":
        return out  # a meta tensor has a shape only (an encoding's own shape pass)
    limit = int(2 / torch.finfo(dtype).eps)
    if torch.compiler.is_compiling() or positions.device.type != "cpu":
        return torch.where((positions > limit) | (positions < -limit), float("nan"), out)
    low, high = (int(v) for v in positions.aminmax())
    if low < -limit or high > limit:
        far = high if high > limit else low
        raise ValueError(
            f"{name} must lie within +-{limit} (2**{limit.bit_length() - 1}, the integers "
            f"{str(dtype).removeprefix('torch.')} holds exactly; beyond it neighbouring "
            f"positions round to one value), got {far}; shift every position by one amount"
        )
    return out
