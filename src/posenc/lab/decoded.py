"""Dynamic NTK as it is deployed: scored as incremental decoding through a KV cache.

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head_dim. Dynamic NTK (emozilla
2023; transformers' ``dynamic`` rope type) stretches the base from the length it sees,
``n = max(len, L0)``: ``base * (s n / L0 - (s - 1)) ** (D / (D - 2))``. Over a whole
window of ``T`` tokens every position uses the base of length ``T``, which makes it a
static NTK stretch at another factor. Deployed, it decodes token by token: the token at
position ``p`` is processed when the sequence is ``p + 1`` long, so its query and its
key (which the cache keeps as rotated) use the base of length ``max(p + 1, L0)``; the
cached keys are not rotated again (transformers' behaviour, ``length_policy=
"transformers"`` of ``posenc.RotaryEmbedding``).

``DecodedDynamicNTK`` gives exactly those scores in one causal forward pass: position
``p`` of the queries and of the keys is rotated with the frequencies of length
``max(p + 1, L0)``. A test checks it against ``posenc.MultiHeadAttention`` decoding one
token at a time through its ``KVCache`` with that ``RotaryEmbedding``; the lab scores
this row beside the whole-window ``+dynamic`` row (``posenc.lab.variants``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from posenc._dtypes import compute_dtype
from posenc.base import PositionalEncoding, Site
from posenc.encodings.rotary.apply import apply_rope
from posenc.encodings.rotary.context_scaling import DynamicNTKScaling, dynamic_ntk_inv_freq

__all__ = ["DecodedDynamicNTK"]


class DecodedDynamicNTK(PositionalEncoding):
    """Half-split RoPE under dynamic NTK, each position at the length it was decoded at.

    Args:
        head_dim: ``D`` (even; every feature rotates).
        factor: dynamic NTK's ``factor``.
        original: ``L0``, the trained length.
        base: RoPE's base.

    Raises:
        ValueError: an odd ``head_dim`` or a bad scaling parameter (named).
    """

    sites = Site.QK

    def __init__(self, head_dim: int, *, factor: float, original: int, base: float = 1e4) -> None:
        super().__init__()
        if head_dim < 2 or head_dim % 2:
            raise ValueError(f"head_dim must be even and >= 2, got {head_dim}")
        self.head_dim, self.base = head_dim, float(base)
        self.params = DynamicNTKScaling(factor=factor, original_max_position_embeddings=original)

    def _cos_sin(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos, sin ``[T, D/2]`` in ``dtype`` of integer ``positions [T]`` (angles float64)."""
        original = self.params.original_max_position_embeddings
        lengths = (positions.long() + 1).clamp(min=original)  # [T]
        unique, where = torch.unique(lengths, return_inverse=True)
        table = torch.stack(
            [
                dynamic_ntk_inv_freq(self.head_dim, self.base, self.params, seq_len=int(n))[0]
                for n in unique.tolist()
            ]
        )  # [U, D/2] float64
        angles = positions.to(torch.float64)[:, None] * table[where]  # [T, D/2], float64
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        """Rotate ``q [B, H, Tq, D]`` at ``q_pos [Tq]``, ``k [B, H, Tk, D]`` at ``k_pos [Tk]``.

        Raises:
            ValueError: positions that are not ``[T]`` of the tensor's length.
        """
        out = []
        for name, pos, x in (("q_pos", q_pos, q), ("k_pos", k_pos, k)):
            if pos.dim() != 1 or pos.numel() != x.shape[-2]:
                raise ValueError(f"{name} must be [{x.shape[-2]}], got {list(pos.shape)}")
            cos, sin = self._cos_sin(pos.cpu(), compute_dtype(x.dtype))
            out.append(apply_rope(x, cos.to(x.device), sin.to(x.device)))
        return out[0], out[1]
