"""Decoupled RoPE of multi-head latent attention (DeepSeek-AI 2024, "DeepSeek-V2", sec.
2.1.3; DeepSeek-V3): only the last ``R = qk_rope_head_dim`` features of each query/key head
rotate, the first ``D - R`` (``qk_nope_head_dim``, decompressed from the latent) do not.

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``D = qk_nope_head_dim + qk_rope_head_dim``
the query/key head dim, ``R`` the rotated part. A head is ``[nope (D - R) | rope (R)]``;
the rope part rotates as half-split RoPE of dim ``R`` (frequencies ``base ** (-2i / R)``,
any non-length-dependent scaling). With ``rope_interleave`` (DeepSeek-V3's default) the
checkpoint's rope features come as adjacent pairs ``(2i, 2i + 1)``; they are gathered into
half-split order first, so the rotated part comes out as ``[even | odd]``, exactly as
transformers' ``apply_rotary_pos_emb_interleave`` returns it (scores equal those of
interleaved RoPE).

Softmax scale: ``D ** -0.5``, times ``mscale(s, mscale_all_dim) ** 2`` under YaRN with
``mscale_all_dim`` (``mscale(s, c) = 0.1 c ln s + 1``), as DeepSeek applies it; cos and
sin carry YaRN's own factor ``mscale(s, mscale) / mscale(s, mscale_all_dim)``. The
encoding reports it as ``softmax_scale``; with ``scale_queries=True`` it multiplies the
queries by ``softmax_scale * sqrt(D)``, so that an attention with the default
``1 / sqrt(D)`` (``MultiHeadAttention``) gives DeepSeek's logits.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from posenc._checks import check_int
from posenc._dtypes import compute_dtype
from posenc.base import PositionalEncoding, Site, register
from posenc.encodings.rotary._shapes import check_qk
from posenc.encodings.rotary.context_scaling import YarnScaling
from posenc.encodings.rotary.module import RotaryEmbedding
from posenc.encodings.rotary.scaling import DEFAULT_BASE, ScalingSpec

__all__ = ["MLARope", "mla_softmax_scale"]


def mla_softmax_scale(head_dim: int, scaling: object = None) -> float:
    """DeepSeek's softmax scale: ``head_dim ** -0.5``, times ``mscale(s, mscale_all_dim)**2``
    for a ``YarnScaling`` with ``mscale_all_dim``."""
    head_dim = check_int("head_dim", head_dim)
    scale = head_dim**-0.5
    if isinstance(scaling, YarnScaling) and scaling.mscale_all_dim:
        factor = scaling.factor
        mscale = 1.0 if factor <= 1.0 else 0.1 * scaling.mscale_all_dim * math.log(factor) + 1.0
        scale *= mscale * mscale
    return scale


@register(
    "mla_rope",
    paper="DeepSeek-AI 2024, DeepSeek-V2 (sec. 2.1.3, decoupled RoPE)",
    description="RoPE on the last qk_rope_head_dim features of each head, the rest unrotated",
)
class MLARope(PositionalEncoding):
    """Decoupled RoPE on the last ``rope_head_dim`` features of each head.

    Args:
        head_dim: ``D``, the query/key head dim (``qk_nope_head_dim + qk_rope_head_dim``).
        rope_head_dim: ``R`` (``qk_rope_head_dim``), even, ``<= D``. None: DeepSeek-V2/V3's
            third of the head (64 of 192), rounded down to even, at least 2.
        base: the RoPE base (``rope_theta``).
        scaling: a frequency scaling (YaRN in the releases), not length-dependent.
        rope_interleave: the rope features come as adjacent pairs (DeepSeek-V3).
        scale_queries: multiply queries by ``softmax_scale * sqrt(D)``.
        max_len: cos/sin cache length built up front.

    Raises:
        ValueError: odd ``rope_head_dim`` or larger than ``head_dim``; a length-dependent
            scaling; the errors of ``RotaryEmbedding``.
    """

    sites = Site.QK

    def __init__(
        self,
        head_dim: int,
        rope_head_dim: int | None = None,
        *,
        base: float = DEFAULT_BASE,
        scaling: ScalingSpec = None,
        rope_interleave: bool = False,
        scale_queries: bool = False,
        max_len: int = 2048,
    ) -> None:
        super().__init__()
        self.head_dim = check_int("head_dim", head_dim)
        if rope_head_dim is None:
            rope_head_dim = max(2, head_dim // 6 * 2)
        rope_head_dim = check_int("rope_head_dim", rope_head_dim)
        if rope_head_dim > head_dim:
            raise ValueError(f"rope_head_dim={rope_head_dim} exceeds head_dim={head_dim}")
        for name, flag in (("rope_interleave", rope_interleave), ("scale_queries", scale_queries)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool, got {flag!r}")
        self.rope = RotaryEmbedding(rope_head_dim, base=base, scaling=scaling, max_len=max_len)
        if self.rope.scaling.length_dependent:
            raise ValueError(
                f"MLA RoPE takes no length-dependent scaling, got rope_type "
                f"{self.rope.scaling.rope_type!r}"
            )
        self.rope_head_dim, self.rope_interleave = rope_head_dim, rope_interleave
        self.scale_queries = scale_queries
        self.softmax_scale = mla_softmax_scale(head_dim, self.rope.scaling)

    def _split(self, x: Tensor) -> tuple[Tensor, Tensor]:
        nope, rope = x.split((self.head_dim - self.rope_head_dim, self.rope_head_dim), dim=-1)
        if self.rope_interleave:
            rope = torch.cat((rope[..., 0::2], rope[..., 1::2]), dim=-1)  # [even | odd]
        return nope, rope

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        """Rotate the rope part of ``q [B, H, Tq, D]`` and ``k [B, Hkv, Tk, D]``.

        Positions are ``[T]`` or ``[B, T]``. Returns new tensors ``[nope | rotated rope]``.

        Raises:
            ValueError: head_dim or batch mismatch; positions not of length ``Tq`` / ``Tk``.
        """
        check_qk(q, k, self.head_dim)
        q_nope, q_rope = self._split(q)
        k_nope, k_rope = self._split(k)
        q_rope, k_rope = self.rope.rotate(q_rope, k_rope, q_pos, k_pos)
        q = torch.cat((q_nope, q_rope), dim=-1)
        if self.scale_queries:
            factor = self.softmax_scale * math.sqrt(self.head_dim)
            compute = compute_dtype(q.dtype)
            q = (q.to(compute) * factor).to(q.dtype)
        return q, torch.cat((k_nope, k_rope), dim=-1)

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, rope_head_dim={self.rope_head_dim}, "
            f"rope_interleave={self.rope_interleave}, softmax_scale={self.softmax_scale}"
        )
