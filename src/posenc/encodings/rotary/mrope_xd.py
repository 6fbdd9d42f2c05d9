"""XD-RoPE (HunYuan-VL / HunyuanOCR): M-RoPE whose axes are assigned to feature blocks of
the half-split ``[cos | cos]`` layout, so the two halves of one pair may follow different
axes (Tencent 2025, "HunyuanOCR Technical Report", sec. 2; transformers'
``HunYuanVLRotaryEmbedding.recomposition_frequencies``).

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head_dim, ``P = D/2`` pairs, ``A``
axes (3 or 4: ``(width, height, image)`` or ``(position, width, height, image)``).
``sections = (s_0, .., s_{A-1})`` sum to ``P``; feature ``f`` of the ``D`` features belongs
to block ``a`` when ``2 (s_0 + .. + s_{a-1}) <= f < 2 (s_0 + .. + s_a)`` and its angle is
``pos[a] * theta_{f mod P}``. Pair ``j`` (features ``j`` and ``j + P``) thus has the angle
``alpha_j = pos[a(j)] theta_j`` on its first feature and ``beta_j = pos[a(j + P)] theta_j``
on its second:

    out_j     = x_j cos(alpha_j) - x_{j+P} sin(alpha_j)
    out_{j+P} = x_{j+P} cos(beta_j) + x_j sin(beta_j)

which is a rotation when ``alpha_j = beta_j`` (text tokens: every axis equal) and, as in
the model, not otherwise. Positions are ``[A, T]`` / ``[A, B, T]``, or text ``[T]`` /
``[B, T]``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from posenc._checks import check_int
from posenc._dtypes import compute_dtype
from posenc.encodings.rotary._shapes import check_qk
from posenc.encodings.rotary.apply import apply_rope
from posenc.encodings.rotary.mrope import MRoPE, _has_axes
from posenc.encodings.rotary.scaling import DEFAULT_BASE, ScalingSpec

__all__ = ["XDRoPE", "xdrope_feature_axes"]


def xdrope_feature_axes(sections: Sequence[int]) -> Tensor:
    """The axis of each of the ``D = 2 sum(sections)`` features, int64 ``[D]``.

    Raises:
        ValueError: fewer than 2 sections, or a negative one.
        TypeError: ``sections`` not a list of integers.
    """
    if isinstance(sections, (str, bytes)) or not isinstance(sections, Sequence):
        raise TypeError(f"sections must be a list of integers, got {sections!r}")
    sizes = [2 * check_int(f"sections[{i}]", s, minimum=0) for i, s in enumerate(sections)]
    if len(sizes) < 2:
        raise ValueError(f"XD-RoPE needs at least 2 sections (axes), got {list(sections)}")
    return torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))


class XDRoPE(MRoPE):
    """HunYuan-VL's XD-RoPE on queries and keys (half-split, the whole head rotates).

    Args:
        head_dim: ``D``, even.
        sections: ``(s_0, .., s_{A-1})``, summing to ``D/2`` (``mrope_section``).
        base: the RoPE base (HunYuan's ``ntk_alpha``: ``rope_theta * alpha ** (D/(D-2))``).
        scaling: a frequency scaling (not length-dependent), as for ``RotaryEmbedding``.
        max_len: cos/sin cache length built up front.

    Raises:
        ValueError: sections that do not sum to ``D/2`` or fewer than 2 of them; the
            errors of ``MRoPE``.
    """

    def __init__(
        self,
        head_dim: int,
        *,
        sections: Sequence[int],
        base: float = DEFAULT_BASE,
        scaling: ScalingSpec = None,
        max_len: int = 2048,
    ) -> None:
        axes = xdrope_feature_axes(sections)
        head_dim = check_int("head_dim", head_dim)
        if axes.numel() != head_dim:
            raise ValueError(
                f"XD-RoPE sections {list(sections)} sum to {axes.numel() // 2}, but the head "
                f"has {head_dim // 2} pairs (head_dim={head_dim})"
            )
        pairs = head_dim // 2
        super().__init__(
            head_dim,
            base=base,
            scaling=scaling,
            pair_axes=axes[:pairs].tolist(),
            num_axes=len(sections),
            max_len=max_len,
        )
        self.sections = tuple(int(s) for s in sections)
        self._second_axes = axes[pairs:]  # the axis of each pair's second feature

    def cos_sin(self, positions: Tensor, *, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """``(cos, sin)`` ``[(B,) T, P]`` of text positions (one angle per pair).

        Raises:
            ValueError: axis positions, where a pair has two angles (use ``rotate``).
        """
        if _has_axes(positions, self.num_axes):
            raise ValueError(
                f"XD-RoPE gives a pair two angles at axis positions {tuple(positions.shape)}; "
                "there is no single cos/sin table: use rotate"
            )
        return super().cos_sin(positions, dtype=dtype)

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        """Rotate ``q [B, H, Tq, D]`` and ``k [B, Hkv, Tk, D]`` at their XD-RoPE positions.

        Raises:
            ValueError: head_dim or batch mismatch; positions as in ``axis_positions``.
        """
        batch = check_qk(q, k, self.head_dim)
        out = []
        for x, pos, name in ((q, q_pos, "q_pos"), (k, k_pos, "k_pos")):
            pos = self.axis_positions(pos, x.shape[-2], batch, name).to(x.device)
            out.append(self._rotate_one(x, pos))
        return out[0], out[1]

    def _rotate_one(self, x: Tensor, pos: Tensor) -> Tensor:
        dtype = compute_dtype(x.dtype)
        cos, sin = self.rope.cos_sin(pos, dtype=dtype)  # [A, (B,) T, P] or text [(B,) T, P]
        if not _has_axes(pos, self.num_axes):
            return apply_rope(x, cos, sin)  # text: both halves share the angle
        parts = []
        for axes in (self._axes, self._second_axes):
            index = axes.to(cos.device).expand(1, *cos.shape[1:])
            parts.append([t.gather(0, index).squeeze(0) for t in (cos, sin)])
        (cos_a, sin_a), (cos_b, sin_b) = parts
        if cos_a.dim() == 3:  # [B, T, P] -> [B, 1, T, P]
            cos_a, sin_a, cos_b, sin_b = (t.unsqueeze(1) for t in (cos_a, sin_a, cos_b, sin_b))
        first, second = x.to(dtype).chunk(2, dim=-1)
        out = torch.cat((first * cos_a - second * sin_a, second * cos_b + first * sin_b), dim=-1)
        return out.to(x.dtype)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, sections={list(self.sections)}"
