"""RoPE on the trailing features of each head, adjacent pairs in place (DeepSeek-AI 2026,
DeepSeek-V4; the ``[nope | rope]`` head layout of MLA, DeepSeek-V2 sec. 2.1.3, without
MLA's regrouping of the rotated pairs or its softmax-scale correction).

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head_dim, ``R`` the rotated part. A
head is ``[nope (D - R) | rope (R)]``; the rope part rotates as RoPE of dim ``R``
(frequencies ``base ** (-2i / R)``, any non-length-dependent scaling, cos/sin times its
attention factor) on the adjacent pairs ``(D - R + 2i, D - R + 2i + 1)`` (or half-split
pairs of the rope part, ``interleaved=False``); the output keeps that layout.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posenc._checks import check_int
from posenc.base import PositionalEncoding, Site
from posenc.encodings.rotary._shapes import check_qk
from posenc.encodings.rotary.module import RotaryEmbedding
from posenc.encodings.rotary.scaling import DEFAULT_BASE, ScalingSpec

__all__ = ["TrailingRope"]


class TrailingRope(PositionalEncoding):
    """RoPE of dim ``R`` on the last ``R`` features of ``q``/``k`` heads of dim ``D``.

    Args:
        head_dim: ``D``.
        rotary_dim: ``R``, even, ``<= D``.
        base: the RoPE base.
        scaling: None, a scaling dataclass or an HF-style dict (not length-dependent).
        interleaved: adjacent pairs (DeepSeek-V4) or half-split pairs of the rope part.

    Raises:
        ValueError: ``rotary_dim`` odd or above ``head_dim``; a length-dependent scaling.
    """

    sites = Site.QK

    def __init__(
        self,
        head_dim: int,
        rotary_dim: int,
        *,
        base: float = DEFAULT_BASE,
        scaling: ScalingSpec = None,
        interleaved: bool = True,
    ) -> None:
        super().__init__()
        self.head_dim = check_int("head_dim", head_dim)
        if check_int("rotary_dim", rotary_dim) > self.head_dim:
            raise ValueError(f"rotary_dim={rotary_dim} exceeds head_dim={head_dim}")
        self.rope = RotaryEmbedding(rotary_dim, base=base, scaling=scaling, interleaved=interleaved)
        if self.rope.scaling.length_dependent:
            raise ValueError(
                "trailing RoPE takes no length-dependent scaling, got rope_type "
                f"{self.rope.scaling.rope_type!r}"
            )
        self.rotary_dim = rotary_dim

    @property
    def base(self) -> float:
        return self.rope.base

    @property
    def attention_scale(self) -> float:
        """The scaling's factor on cos and sin."""
        return self.rope.attention_scale

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        """Rotate the last ``R`` features of ``q [B, H, Tq, D]`` and ``k [B, Hkv, Tk, D]`` at
        positions ``[T]`` / ``[B, T]``.

        Raises:
            ValueError: head_dim or batch mismatch; see ``RotaryEmbedding.rotate``.
        """
        check_qk(q, k, self.head_dim)
        keep = self.head_dim - self.rotary_dim
        (q_pass, q_rot), (k_pass, k_rot) = (x.split((keep, self.rotary_dim), -1) for x in (q, k))
        q_rot, k_rot = self.rope.rotate(q_rot, k_rot, q_pos, k_pos)
        return torch.cat((q_pass, q_rot), -1), torch.cat((k_pass, k_rot), -1)

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base}, "
            f"scaling={self.rope.scaling}, interleaved={self.rope.interleaved}"
        )
