"""vLLM's rotary modules probed for their angles: one head per basis vector.

Shapes: ``P`` probed positions, ``D`` head_size, ``R`` rotary_dim, ``H`` heads.

``forward_native(positions, q, k)`` on ``q = k = I_D`` (one head per basis vector) gives the
rotation ``M_p [D, D]`` vLLM applies at position ``p``. Its nonzero off-diagonal entries give
the pairs (half split ``(j, j+R/2)`` or adjacent ``(2j, 2j+1)``); pair ``j``'s first column is
``s_p (cos a, sin a)``, so the angle ``a_pj`` and the cos/sin scale ``s_p`` (YaRN's mscale,
Peng et al. 2023, eq. 22) come back. Angles are unwrapped against positions 0 and 1
(``a_0j + p (a_1j - a_0j)`` up to whole turns), so the table is ``p * theta_j`` as vLLM
computes it in float32. A position past the module's cache is not run (vLLM indexes out of
range there): its row is NaN, and a note says so.
"""

from __future__ import annotations

import math
from typing import Any

import torch

AXES_PROBE = 1  # the position each M-RoPE axis is probed at alone


def _rotations(
    call: Any, positions: torch.Tensor, head_size: int, *, split_heads: bool = False
) -> torch.Tensor:
    """``[P, D, D]``: ``M_p`` with column ``i`` the image of basis vector ``e_i``.

    ``split_heads``: pass ``[P, H, D]`` (as DeepSeek's MLA passes its rope part), not
    ``[P, H*D]``.
    """
    n = positions.shape[-1]
    eye = torch.eye(head_size, dtype=torch.float32).reshape(1, head_size * head_size)
    q = eye.repeat(n, 1)  # [P, H=D heads * D]
    if split_heads:
        q = q.reshape(n, head_size, head_size)  # [P, H, D]
    out, _ = call(positions, q, q.clone())
    return out.reshape(n, head_size, head_size).transpose(1, 2).double()  # [P, out, in]


def _pairs(m: torch.Tensor) -> tuple[str, list[int], list[int]]:
    """The pair layout, each pair's first dim and its partner, from ``M`` at all positions."""
    d = m.shape[-1]
    off = (m - torch.eye(d, dtype=m.dtype)).abs().amax(dim=0)  # [out, in]
    off.fill_diagonal_(0.0)
    moved = [i for i in range(d) if off[:, i].max() > 1e-6]
    if not moved:
        return "none", [], []
    rot = len(moved)
    if moved != list(range(rot)) or rot % 2:
        raise ValueError(f"vLLM rotates dims {moved}, not a leading even block")
    partner = [int(off[:, i].argmax()) for i in range(rot)]
    half = rot // 2
    if all(partner[j] == j + half and partner[j + half] == j for j in range(half)):
        return "half", list(range(half)), list(range(half, rot))
    if all(partner[2 * j] == 2 * j + 1 for j in range(half)):
        return "adjacent", list(range(0, rot, 2)), list(range(1, rot, 2))
    raise ValueError(f"vLLM's rotation pairs dims as {partner}, neither half split nor adjacent")


def unrotated(head_size: int, n: int) -> dict[str, Any]:
    """A layer that does not rotate, as a ``LayerPositions`` dict."""
    return dict(
        rotates=False,
        head_dim=head_size,
        rotary_dim=0,
        pairs="none",
        angles=[[] for _ in range(n)],
        scale=[1.0] * n,
    )


def _layer(
    m: torch.Tensor, positions: list[int], head_size: int, unwrap: bool
) -> tuple[dict[str, Any], bool]:
    """``LayerPositions`` dict from ``M`` at [0, 1, *positions]; whether the scale varies by pair.

    Unwrapped, angle ``a_p`` is the one within half a turn of ``a_0 + p (a_1 - a_0)``.
    """
    pairs, first, second = _pairs(m)
    n = len(positions)
    if pairs == "none":
        return unrotated(head_size, n), False
    idx_f, idx_s = torch.tensor(first), torch.tensor(second)
    cos = m[:, idx_f, idx_f]  # [2 + P, R/2]: s cos(a) of each pair
    sin = m[:, idx_s, idx_f]  # s sin(a)
    wrapped = torch.atan2(sin, cos)
    scale = torch.hypot(cos, sin)
    angles, scale = wrapped[2:], scale[2:]
    if unwrap:
        pos = torch.tensor(positions, dtype=torch.float64)[:, None]
        guess = wrapped[0] + pos * (wrapped[1] - wrapped[0])
        angles = angles + 2 * math.pi * torch.round((guess - angles) / (2 * math.pi))
    per_pair = bool((scale - scale.mean(-1, keepdim=True)).abs().max() > 1e-6)
    layer = dict(
        rotates=True,
        head_dim=head_size,
        rotary_dim=2 * len(first),
        pairs=pairs,
        angles=angles.tolist(),
        scale=scale.mean(-1).tolist(),
    )
    return layer, per_pair


def _cache_rows(rope: Any) -> int | None:
    for name in ("cos_sin_cache", "long_short_cos_sin_cache", "cos_sin_k_cache"):
        cache = getattr(rope, name, None)
        if isinstance(cache, torch.Tensor):
            return int(cache.shape[0])
    return None


def probe(rope: Any, positions: list[int]) -> tuple[dict[str, Any], list[str]]:
    """One rotary module's layer dict and notes."""
    name = type(rope).__name__
    head_size = rope.head_size
    notes: list[str] = []
    if name == "Llama4VisionRotaryEmbedding":  # positions are the patch grid (+ CLS), implicit
        rows = _cache_rows(rope)
        eye = torch.eye(head_size).reshape(1, 1, head_size, head_size).repeat(1, rows, 1, 1)
        out, _ = rope.forward_native(eye, eye.clone())  # [1, N, H=D, D]
        m = out[0].transpose(1, 2).double()
        m = torch.cat([m[:2], m[positions]])  # the first rows only feed the pair search
        layer, per_pair = _layer(m, positions, head_size, unwrap=False)
        return layer, [f"{name}: positions are patch indices (row major, CLS last)"]
    rows = _cache_rows(rope)
    run = [p for p in positions if rows is None or p < rows]
    if len(run) < len(positions):
        notes.append(f"{name}: positions >= {rows} (its cache) are not computed by vLLM (NaN)")
    batch = [0, 1, *run]
    mrope = "MRotary" in name or "Ernie4_5_VL" in name or "Bailing" in name
    pos = torch.tensor(batch, dtype=torch.long)
    if mrope:
        pos = pos[None, :].repeat(3, 1)
    call = rope if name.startswith("Phi3LongRoPE") else rope.forward_native
    m = _rotations(call, pos, head_size, split_heads=name.startswith("Deepseek"))
    layer, per_pair = _layer(m, run, head_size, unwrap=True)
    if per_pair:
        notes.append(f"{name}: the cos/sin scale differs between pairs; the mean is shown")
    if len(run) < len(positions):
        keep = {p: i for i, p in enumerate(run)}
        nan = [math.nan] * (layer["rotary_dim"] // 2)
        layer["angles"] = [layer["angles"][keep[p]] if p in keep else nan for p in positions]
        layer["scale"] = [layer["scale"][keep[p]] if p in keep else math.nan for p in positions]
    if mrope:
        layer["extra"] = {"pair_axes": _pair_axes(rope, head_size, layer["pairs"])}
    return layer, notes


def _pair_axes(rope: Any, head_size: int, pairs: str) -> list[int]:
    """Which of the three M-RoPE axes (t, h, w) turns each pair (-1: none)."""
    turned = []
    for axis in range(3):
        pos = torch.zeros(3, 2, dtype=torch.long)
        pos[axis] = AXES_PROBE
        m = _rotations(rope.forward_native, pos, head_size)[1]
        turned.append((m - torch.eye(head_size, dtype=m.dtype)).abs())  # [out, in]
    first = range(rope.rotary_dim // 2) if pairs == "half" else range(0, rope.rotary_dim, 2)
    axes = []
    for i in first:
        hits = [a for a in range(3) if turned[a][:, i].max() > 1e-6]
        axes.append(hits[0] if len(hits) == 1 else -1)
    return axes
