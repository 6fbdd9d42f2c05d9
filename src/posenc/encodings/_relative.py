"""Shared machinery of the attention-bias encodings: checks, offsets, Toeplitz biases.

Shapes: ``B`` batch, ``H`` heads, ``Tq`` queries, ``Tk`` keys, ``D`` head_dim. A bias
that depends only on the offset ``d = q_pos - k_pos`` is a Toeplitz matrix when both
position vectors are runs of consecutive integers: it takes only ``Tq + Tk - 1`` distinct
values, so it is evaluated on those and expanded (one copy, in the output dtype) instead
of being evaluated on a ``[Tq, Tk]`` matrix. Any other positions (per-sequence ``[B, T]``,
gaps, floats) take the general path, which evaluates the offsets elementwise.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from posenc._checks import check_float_dtype, check_tensor, resolve_positions
from posenc._dtypes import compute_dtype

#: ``fn(d, dtype) -> bias``: ``d [N0, 1, N1, N2]`` offsets ``q_pos - k_pos`` (int64 for
#: integer positions, float otherwise) -> ``[N0, H, N1, N2]`` computed in ``dtype``.
OffsetFn = Callable[[Tensor, torch.dtype], Tensor]

#: FlexAttention's ``score_mod(score, b, h, q_idx, kv_idx) -> score``.
ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]


def check_hook_inputs(
    q: Tensor,
    k: Tensor,
    q_pos: Tensor,
    k_pos: Tensor,
    *,
    num_heads: int | None = None,
    module: nn.Module | None = None,
    same_dtype: bool = False,
) -> tuple[Tensor, Tensor]:
    """Validate ``q [B, H, Tq, D]``, ``k [B, H, Tk, D]`` and their positions.

    ``module``: the encoding, whose parameters (if any) must be on ``q``'s device.
    ``same_dtype``: require one dtype for ``q`` and ``k`` (biases computed from both).

    Returns:
        ``(q_pos, k_pos)`` on ``q``'s device, each ``[T]`` or ``[B|1, T]``.

    Raises:
        ValueError: wrong ranks, mismatched batch/heads/head_dim, positions whose length
            does not match (the message names the shapes), positions on the meta device,
            or ``module``'s parameters on another device.
        TypeError: non-float or complex ``q``/``k``, ``q`` and ``k`` of different dtypes
            with ``same_dtype``, or bf16/fp16 positions.
    """
    check_tensor("q", q, ndim=4, allow_meta=True)  # the bias's shape follows from q's
    check_tensor("k", k, ndim=4, allow_meta=True)
    if same_dtype and q.dtype != k.dtype:
        raise TypeError(f"q and k must share a dtype, got q {q.dtype} and k {k.dtype}")
    if q.shape[0] != k.shape[0] or q.shape[1] != k.shape[1] or q.shape[3] != k.shape[3]:
        raise ValueError(
            f"q {tuple(q.shape)} and k {tuple(k.shape)} must share batch, heads and head_dim"
        )
    if num_heads is not None and q.shape[1] != num_heads:
        raise ValueError(f"q has {q.shape[1]} heads, the encoding was built for {num_heads}")
    param = next(iter(module.parameters()), None) if module is not None else None
    if param is not None and param.device != q.device:
        raise ValueError(
            f"q is on {q.device} but the {type(module).__name__} parameters are on "
            f"{param.device}; move the encoding with .to({str(q.device)!r})"
        )
    batch = q.shape[0]
    q_pos = resolve_positions(q_pos, q.shape[2], batch=batch, device=q.device, name="q_pos")
    k_pos = resolve_positions(k_pos, k.shape[2], batch=batch, device=q.device, name="k_pos")
    return q_pos.to(q.device), k_pos.to(q.device)


def check_position_pair(q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
    """Validate free-standing positions ``[Tq] | [B, Tq]`` and ``[Tk] | [B, Tk]``.

    Raises:
        ValueError: a rank other than 1 or 2, or batch sizes that do not broadcast.
        TypeError: not a tensor, or bool/complex/bf16/fp16 positions.
    """
    for name, pos in (("q_pos", q_pos), ("k_pos", k_pos)):
        if not isinstance(pos, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(pos).__name__}")
        if pos.dim() not in (1, 2):
            raise ValueError(f"{name} must have shape [T] or [B, T], got {tuple(pos.shape)}")
        resolve_positions(pos, pos.shape[-1], name=name)
    batches = {q_pos.shape[0] if q_pos.dim() == 2 else 1, k_pos.shape[0] if k_pos.dim() == 2 else 1}
    if len(batches - {1}) > 1:
        raise ValueError(
            f"q_pos {tuple(q_pos.shape)} and k_pos {tuple(k_pos.shape)} batch sizes differ"
        )
    return q_pos, k_pos.to(q_pos.device)


def require_integer(encoding: str, q_pos: Tensor, k_pos: Tensor) -> None:
    """Raise ``TypeError`` for float positions (``encoding`` indexes integer offsets)."""
    for name, pos in (("q_pos", q_pos), ("k_pos", k_pos)):
        if pos.is_floating_point():
            raise TypeError(f"{encoding} needs integer positions; {name} has dtype {pos.dtype}")


def _shared_row(pos: Tensor) -> Tensor | None:
    """``pos`` as one ``[T]`` vector when every sequence shares it (without a sync)."""
    if pos.dim() == 1:
        return pos
    if pos.shape[0] == 1 or pos.stride(0) == 0:
        return pos[0]
    return None


def consecutive_runs(q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor] | None:
    """``(q_row, k_row)`` when both are shared integer runs ``a, a+1, ...``; else None.

    The check costs one host sync; under ``torch.compile`` it is skipped (None), and the
    elementwise path, which the compiler fuses, is used instead.
    """
    if torch.compiler.is_compiling() or q_pos.device.type == "meta":
        return None  # meta tensors carry shapes only: take the elementwise path
    q_row, k_row = _shared_row(q_pos), _shared_row(k_pos)
    if q_row is None or k_row is None or q_row.is_floating_point() or k_row.is_floating_point():
        return None
    steps = torch.cat((q_row.diff(), k_row.diff()))
    if steps.numel() and not bool((steps == 1).all()):
        return None
    return q_row, k_row


def offsets(q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """``q_pos - k_pos`` as ``[B|1, 1, Tq, Tk]``: int64 for integer positions, else float."""
    if q_pos.is_floating_point() or k_pos.is_floating_point():
        common = torch.promote_types(torch.promote_types(q_pos.dtype, k_pos.dtype), torch.float32)
    else:
        common = torch.int64
    q = q_pos.to(common)
    k = k_pos.to(common)
    d = q.unsqueeze(-1) - k.unsqueeze(-2)  # [Tq, Tk] or [B, Tq, Tk]
    return (d if d.dim() == 3 else d.unsqueeze(0)).unsqueeze(1)  # no view(-1): T may be 0


def toeplitz_bias(fn: OffsetFn, q_pos: Tensor, k_pos: Tensor, dtype: torch.dtype) -> Tensor:
    """The bias ``fn(q_pos - k_pos)`` as ``[B|1, H, Tq, Tk]`` in ``dtype``.

    ``fn`` sees the ``Tq + Tk - 1`` distinct offsets when both position vectors are
    consecutive integer runs (Toeplitz path), else the full offset matrix.

    Raises:
        TypeError: a non-floating ``dtype`` (an integer bias would round every slope).
    """
    check_float_dtype("dtype", dtype)
    work = compute_dtype(dtype)
    runs = consecutive_runs(q_pos, k_pos)
    if runs is None:
        return fn(offsets(q_pos, k_pos), work).to(dtype)
    q_row, k_row = runs
    tq, tk = q_row.shape[0], k_row.shape[0]
    if tq == 0 or tk == 0:
        return fn(offsets(q_row, k_row), work).to(dtype)
    # offsets q_pos[i] - k_pos[j] = c + i - j, listed from c + Tq - 1 down to c - (Tk - 1):
    # row i of the bias is the window starting at Tq - 1 - i.
    c = q_row[0].to(torch.int64) - k_row[0].to(torch.int64)
    distinct = c + torch.arange(tq - 1, -tk, -1, device=q_row.device, dtype=torch.int64)
    values = fn(distinct.view(1, 1, 1, -1), work)[0, :, 0].to(dtype)  # [H, Tq + Tk - 1]
    return values.unfold(-1, tk, 1).flip(-2).unsqueeze(0)  # [1, H, Tq, Tk]


def offset_score_mod(fn: OffsetFn) -> ScoreMod:
    """A FlexAttention ``score_mod`` adding ``fn(q_idx - kv_idx)`` (indices as positions).

    For eager ``flex_attention``: torch 2.13's inductor cannot compile it for the CPU (it
    fails to lower the reshape of the offset, loudly), which is why posenc's ``flex``
    backend reads these biases from an offset table instead."""

    def score_mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        d = (q_idx - kv_idx).reshape(1, 1, 1, 1)
        return score + fn(d, torch.float32)[0, h, 0, 0].to(score.dtype)

    return score_mod


def band_dots(q: Tensor, k: Tensor, width: int, rows: int = 512) -> Tensor:
    """``dots[..., i, d] = q_i . k_(i-d)`` for ``d < width`` (0 where ``d > i``), the
    ``width`` diagonals of ``q k^T`` nearest the main one, ``[B, H, T, width]``.

    By blocks of ``rows`` queries: one matmul with the keys the block reaches, taken in
    reverse order so that the band is a strided (Hankel) view of the block's scores.
    """
    batch, heads, length, dim = q.shape
    pad = k.new_zeros(batch, heads, width - 1, dim)
    rev = torch.cat((pad, k), -2).flip(-2)  # key T - 1 - c at c, then the padding
    out = q.new_empty(batch, heads, length, width)
    for start in range(0, length, rows):
        stop = min(start + rows, length)
        reach = rev[..., length - stop : length - start + width - 1, :]  # keys stop-1 down
        scores = torch.matmul(q[..., start:stop, :], reach.transpose(-2, -1))  # [B, H, Tb, n]
        n, size = scores.shape[-1], stop - start
        out[..., start:stop, :] = scores.as_strided(  # (r, d) -> column size - 1 - r + d
            (batch, heads, size, width), (heads * size * n, size * n, n - 1, 1), size - 1
        )
    return out


def per_head(values: Tensor, dtype: torch.dtype) -> Tensor:
    """``values [H]`` as ``[H, 1, 1]`` in ``dtype``, to broadcast against offsets."""
    return values.to(dtype).view(-1, 1, 1)
