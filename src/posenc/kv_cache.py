"""Key/value cache for incremental (token-by-token) decoding with ``MultiHeadAttention``.

Shapes: ``B`` batch, ``Hkv`` key/value heads, ``Tk`` cached keys, ``T`` new tokens,
``D`` head_dim.

The cache stores what attention needs about every past key: the keys *after* the
encoding's QK hook (RoPE, xPos rotate each key once, with its own position), the values,
the key positions (SCORE and VALUE hooks recompute their terms from positions at every
step, e.g. ALiBi's ``-m (i - j)``), the key padding mask and, for packed sequences, the
segment ids. Keys and values are kept at ``Hkv`` heads (grouped-query attention stores
the small tensors). Appending concatenates, so a cache of ``Tk`` keys is copied once per
step; decoding is dominated by attention itself, which also reads all ``Tk`` keys.

One cache holds one sequence of calls: a call that finds it in use by another (threads
sharing a cache) raises ``RuntimeError`` instead of interleaving two histories.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

__all__ = ["KVCache"]


def _batched(positions: Tensor, batch: int) -> Tensor:
    """``[T]`` or ``[B|1, T]`` positions as ``[B, T]`` (a view, no copy)."""
    if positions.dim() == 1:
        positions = positions.unsqueeze(0)
    return positions.expand(batch, -1)


def _join_positions(old: Tensor, new: Tensor) -> Tensor:
    """Concatenate key positions, keeping ``[T]`` while both are shared by the batch."""
    if old.dim() == 1 and new.dim() == 1:
        return torch.cat((old, new.to(old.device)))
    batch = max(old.shape[0] if old.dim() == 2 else 1, new.shape[0] if new.dim() == 2 else 1)
    return torch.cat((_batched(old, batch), _batched(new.to(old.device), batch)), dim=-1)


class KVCache:
    """The past keys, values and key positions of one attention layer.

    Create one empty ``KVCache()`` per layer and pass it as ``cache=`` to every call of
    that layer: first the prompt (prefill), then one or more new tokens per step. The
    layer appends in place. Positions default to continuing after each sequence's last
    cached position, so plain decoding needs no bookkeeping; left-padded batches pass
    their ``[B, T]`` positions explicitly.

    Attributes:
        keys: ``[B, Hkv, Tk, D]`` keys after the encoding's QK hook, or None when empty.
        values: ``[B, Hkv, Tk, D]`` values, or None.
        positions: ``[Tk]`` or ``[B, Tk]`` key positions, or None.
        key_padding_mask: ``[B, Tk]`` bool (True = attend), or None when no call gave one.
        segment_ids: ``[B, Tk]`` document ids of packed sequences, or None.
        gates: ``[B, H, Tk, G]`` per-token gates of a WEIGHTS-site encoding (FoX's
            cumulative log forget gates), or None.
        rotations: per encoding (by ``id``), the frequencies the cached keys were rotated
            with, so length-dependent RoPE scalings can re-rotate them (``sync_cache``).
    """

    def __init__(self) -> None:
        self._busy = threading.Lock()
        self.reset()

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        del state["_busy"]  # a lock is neither copied nor pickled: a copy is idle
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._busy = threading.Lock()

    @contextmanager
    def in_use(self) -> Iterator[KVCache]:
        """Hold the cache for one call (``MultiHeadAttention`` does); a second call while
        it is held, from another thread, raises instead of interleaving the two histories.

        Raises:
            RuntimeError: another call is using this cache now.
        """
        if not self._busy.acquire(blocking=False):
            raise RuntimeError(
                "this KVCache is in use by another call (another thread?); a cache holds "
                "one sequence of calls: give each thread its own KVCache"
            )
        try:
            yield self
        finally:
            self._busy.release()

    def reset(self) -> None:
        """Empty the cache (start a new batch of sequences)."""
        self.keys: Tensor | None = None
        self.values: Tensor | None = None
        self.positions: Tensor | None = None
        self.key_padding_mask: Tensor | None = None
        self.segment_ids: Tensor | None = None
        self.gates: Tensor | None = None
        #: What each length-dependent encoding last rotated the keys with (its own records).
        self.rotations: dict[int, object] = {}

    def __len__(self) -> int:
        return 0 if self.keys is None else self.keys.shape[-2]

    def __repr__(self) -> str:
        shape = None if self.keys is None else tuple(self.keys.shape)
        return f"KVCache(len={len(self)}, keys={shape})"

    def next_positions(self, seq_len: int, device: torch.device) -> Tensor:
        """Default positions of ``seq_len`` new tokens: ``[T]`` or ``[B, T]``.

        ``arange(seq_len)`` for an empty cache, else each sequence continues after its last
        cached position.
        """
        steps = torch.arange(seq_len, device=device)
        if self.positions is None:
            return steps
        last = self.positions[..., -1:].to(device)  # [1] or [B, 1]
        return last + 1 + steps

    def check_batch(self, keys: Tensor) -> None:
        """Raise ``ValueError`` unless new ``keys [B, Hkv, T, D]`` match the cached ones."""
        if self.keys is None:
            return
        old = (self.keys.shape[0], self.keys.shape[1], self.keys.shape[3])
        new = (keys.shape[0], keys.shape[1], keys.shape[3])
        if old != new:
            raise ValueError(
                f"the cache holds (batch, kv heads, head_dim) = {old} but the new keys have "
                f"{new}; use one KVCache per layer and reset() it for a new batch"
            )

    def append(
        self,
        keys: Tensor,
        values: Tensor,
        positions: Tensor,
        *,
        key_padding_mask: Tensor | None = None,
        segment_ids: Tensor | None = None,
        gates: Tensor | None = None,
    ) -> None:
        """Append ``T`` new keys/values (``[B, Hkv, T, D]``) with their positions.

        Args:
            keys: new keys after the QK hook, ``[B, Hkv, T, D]``.
            values: new values, ``[B, Hkv, T, D]``.
            positions: positions of the new keys, ``[T]`` or ``[B, T]``.
            key_padding_mask: ``[B, T]`` (the new keys) or ``[B, Tk + T]`` (every key,
                replacing the cached mask); True = attend. None: all new keys attend.
            segment_ids: ``[B, T]`` document ids of the new keys; must be given on every
                call or on none.
            gates: ``[B, H, T, G]`` gates of the new tokens (WEIGHTS-site encodings).

        Raises:
            ValueError: shapes that do not match the cache, a mask of another length, or
                segment ids given on some calls only.
        """
        self.check_batch(keys)
        batch, past, new = keys.shape[0], len(self), keys.shape[-2]
        self.key_padding_mask = self._joined_mask(key_padding_mask, batch, past, new, keys.device)
        if past and (segment_ids is None) != (self.segment_ids is None):
            raise ValueError(
                "segment_ids must be given on every call with a cache or on none; "
                f"the cache {'has' if self.segment_ids is not None else 'has no'} segment ids "
                f"but this call passed {'none' if segment_ids is None else 'some'}"
            )
        if segment_ids is not None:
            old = self.segment_ids
            self.segment_ids = segment_ids if old is None else torch.cat((old, segment_ids), -1)
        if gates is not None:
            self.gates = gates if self.gates is None else torch.cat((self.gates, gates), -2)
        if self.keys is None:
            self.keys, self.values, self.positions = keys, values, positions
        else:
            self.keys = torch.cat((self.keys, keys), dim=-2)
            self.values = torch.cat((self.values, values), dim=-2)
            self.positions = _join_positions(self.positions, positions)

    def _joined_mask(
        self, mask: Tensor | None, batch: int, past: int, new: int, device: torch.device
    ) -> Tensor | None:
        """The ``[B, Tk + T]`` key padding mask after appending ``new`` keys, or None."""
        if mask is not None and mask.shape[-1] == past + new:
            return mask
        if mask is None and self.key_padding_mask is None:
            return None
        if mask is None:
            mask = torch.ones(batch, new, dtype=torch.bool, device=device)
        old = self.key_padding_mask
        if old is None:
            old = torch.ones(batch, past, dtype=torch.bool, device=device)
        return torch.cat((old, mask), dim=-1)
