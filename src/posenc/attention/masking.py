"""Which keys each query may attend to: ``Masking``, shared by the attention backends and
their blocks.

Shapes: ``B`` batch, ``Tq`` queries, ``Tk`` keys. A key is visible to a query iff
``k_pos <= q_pos`` (causal), the key is not padding, and both lie in the same segment
(packed sequences); the mask is built per block of queries, never as a whole ``[Tq, Tk]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["Masking"]


@dataclass(frozen=True)
class Masking:
    """Which keys each query may attend to, as positions and ids (never a ``[Tq, Tk]`` mask).

    Attributes:
        causal: a key is visible iff ``k_pos <= q_pos``.
        q_pos: query positions ``[Tq]`` or ``[B, Tq]``.
        k_pos: key positions ``[Tk]`` or ``[B, Tk]``.
        key_padding_mask: ``[B, Tk]`` bool, True = attend; None: no padding.
        q_seg: ``[B, Tq]`` segment ids of the queries (packed sequences), or None.
        k_seg: ``[B, Tk]`` segment ids of the keys, or None.
        aligned: True when the queries are the keys at positions ``0..T-1`` (no cache, no
            padding, no segments), so a causal mask is SDPA's ``is_causal``.
    """

    causal: bool
    q_pos: Tensor
    k_pos: Tensor
    key_padding_mask: Tensor | None = None
    q_seg: Tensor | None = None
    k_seg: Tensor | None = None
    aligned: bool = False

    def block(self, start: int, stop: int, keys: slice) -> Tensor | None:
        """Bool mask ``[B|1, 1, stop - start, len(keys)]`` for queries ``start:stop`` and
        the keys ``keys`` (True = attend), or None when every key is visible."""
        mask = None
        if self.causal:
            q = self.q_pos[..., start:stop, None]
            mask = self.k_pos[..., None, keys] <= q  # [Tq, Tk] or [B, Tq, Tk]
        if self.q_seg is not None and self.k_seg is not None:
            same = self.k_seg[:, None, keys] == self.q_seg[:, start:stop, None]
            mask = same if mask is None else mask & same
        if self.key_padding_mask is not None:
            keep = self.key_padding_mask[:, None, keys]  # [B, 1, Tk]
            mask = keep if mask is None else mask & keep
        if mask is None:
            return None
        return mask.unsqueeze(-3) if mask.dim() == 3 else mask[None, None]

    def key_ranges(
        self, starts: list[int], block_size: int, num_keys: int
    ) -> list[tuple[int, int]]:
        """Per query block ``start:start + block_size``, the keys that need a mask:
        ``(first, limit)`` where keys ``>= limit`` are invisible to every query of the
        block and keys ``< first`` are visible to all of them.

        Only a causal mask over non-decreasing key positions narrows the range; padding
        and segments need the mask on every key (``first = 0``). Under ``torch.compile``
        every block masks every key: the range is read from the positions on the host,
        which a graph cannot do without breaking (or, with ``fullgraph=True``, failing).
        """
        k_pos = self.k_pos
        compiling = torch.compiler.is_compiling()
        if compiling or not self.causal or bool((k_pos[..., 1:] < k_pos[..., :-1]).any()):
            return [(0, num_keys)] * len(starts)
        blocks = [self.q_pos[..., s : s + block_size] for s in starts]
        latest = torch.stack([b.amax(-1) for b in blocks], -1)  # [blocks] or [B, blocks]
        earliest = torch.stack([b.amin(-1) for b in blocks], -1)
        bounds = torch.cat((latest, earliest), -1)  # [2 * blocks] or [B, 2 * blocks]
        if k_pos.dim() == 2:  # one sorted row per sequence: one row of bounds each
            bounds = bounds.expand(k_pos.shape[0], -1)
        common = torch.promote_types(k_pos.dtype, bounds.dtype)
        counts = torch.searchsorted(
            k_pos.to(common).contiguous(), bounds.to(common).contiguous(), right=True
        ).reshape(-1, 2, len(starts))
        limits, firsts = counts[:, 0].amax(0).tolist(), counts[:, 1].amin(0).tolist()
        if self.key_padding_mask is not None or self.q_seg is not None:
            firsts = [0] * len(starts)
        return list(zip(firsts, limits, strict=True))
