"""Rotary position embedding (Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary
Position Embedding", sec. 3.2, eq. 34).

Shapes: ``B`` batch, ``H`` query heads, ``Hkv`` key heads, ``T`` length (``Tq``, ``Tk``),
``D`` head_dim, ``R`` rotary_dim (even, ``<= D``). Pair ``i < R/2`` of a query or key at
position ``m`` is rotated by the angle ``m * inv_freq[i]``, so ``<R_m q, R_n k>`` depends
on ``m - n`` only; features ``R..D-1`` pass through (partial rotary, GPT-NeoX / Phi).

Numerics: ``inv_freq`` is a float64 master (from ``rope_scaling``); angles
``position * inv_freq`` are formed in float64 (float32 on devices without it), never in
the input's dtype; cos and sin are multiplied by the scaling's attention scale (as
transformers does) and cached per ``(device, dtype)`` in a plain dict, float32 (float64
for float64 inputs), grown by swapping in a longer table. Nothing is a buffer, so
``module.to(torch.bfloat16)`` leaves the frequencies exact.

Length policy for the length-dependent scalings (dynamic NTK, LongRoPE), ``length_policy``:

* ``"monotone"`` (default, KV-consistent): the frequencies are those of the longest length
  seen, ``max(position) + 1`` over every ``rotate`` call, which in KV-cache decoding is the
  total length including the cache. They change only when that length grows (never back,
  until ``reset_length()``); each change is reported as a ``FrequencyChange`` to the hooks of
  ``register_frequency_hook`` *before* the new queries and keys are rotated, and a cached
  forward (``rotate_cached``) re-rotates the cached keys (``rerotate_keys``) instead of
  discarding them. ``observe_length(n)`` pins the length up front, so that decoding up to
  ``n`` tokens never changes the frequencies; under context parallelism every rank calls
  it with the full length, since a shard sees only its own positions.
* ``"transformers"`` (a drop-in for Hugging Face models): what transformers 5 does. Dynamic
  NTK grows with the longest length seen and returns to the original frequencies as soon
  as a call's length is below the original length; LongRoPE picks its long or short
  factors from each call's own length. Cached keys are not re-rotated (as in
  transformers), so decoding across a change is not KV-consistent.

Threads: every forward takes one snapshot of the frequency state and rotates queries,
keys and (in ``rotate_cached``) the cached keys with it, so one module shared by threads
that decode with their own caches keeps every cache consistent.

Cost follows the number of positions asked for, not their value: cos/sin of positions
below ``max(max_len, TABLE_ROWS)`` come from a cached table; larger positions are
evaluated directly (a decode step at position 2^24 builds no 2^24-row table).

Negative positions: allowed; they rotate by negative angles (computed directly, not
cached), and ``<R_m q, R_n k>`` still depends on ``m - n`` only, so shifting every
position below zero leaves the scores unchanged.
"""

from __future__ import annotations

import functools
import inspect
import math
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor
from torch.utils.hooks import RemovableHandle

from posenc._checks import check_bool, check_int, check_tensor, resolve_positions
from posenc._dtypes import compute_dtype
from posenc.base import PositionalEncoding, Site, check_token_axis, register
from posenc.encodings.rotary.apply import check_dense, rotate_checked
from posenc.encodings.rotary.functional import (
    Frequencies,
    rerotate_keys,
    rope_cos_sin,
)
from posenc.encodings.rotary.scaling import DEFAULT_BASE, ScalingSpec, resolve_scaling

__all__ = ["LAYOUTS", "LENGTH_POLICIES", "TABLE_ROWS", "FrequencyChange", "RotaryEmbedding"]

#: The length policies of the length-dependent scalings (module docstring).
LENGTH_POLICIES = ("monotone", "transformers")

#: The axis orders ``forward`` accepts: ``[B, H, T, D]`` (the hooks' order) or ``[B, T, H, D]``.
LAYOUTS = ("bhtd", "bthd")

#: Rows of cos/sin cached at most per (device, dtype) beyond ``max_len``; larger positions
#: are evaluated directly.
TABLE_ROWS = 1 << 16


@dataclass(frozen=True)
class FrequencyChange:
    """New frequencies picked by a length-dependent scaling.

    Attributes:
        old: ``(inv_freq [R/2] float64, attention_scale)`` used until now.
        new: the frequencies used from now on.
        length: the length (``max(position) + 1``) that caused the change.
    """

    old: Frequencies
    new: Frequencies
    length: int


@dataclass(frozen=True)
class _State:
    length: int  # longest length seen (0: none)
    inv_freq: Tensor  # float64 [R/2], on the CPU
    scale: float
    # (device, dtype) -> (cos, sin) [N, R/2]; (device, dtype, T) -> their first T rows
    tables: dict = field(default_factory=dict)


@register(
    "rope",
    paper="Su et al. 2021, RoFormer (eq. 34); scalings: Chen 2023, Peng 2023, Ding 2024",
    description="rotates query/key pairs by position * frequency; context-extension scalings",
)
class RotaryEmbedding(PositionalEncoding):
    """Rotary embedding of queries and keys, with an optional frequency scaling.

    Args:
        head_dim: ``D``, even.
        base: the RoPE base ``theta`` (``rope_theta``).
        scaling: None, a scaling dataclass (``YarnScaling(...)``) or an HF-style dict.
        rotary_dim: ``R``, the number of rotated features (default ``D``).
        interleaved: pair layout: False for half-split ``(i, i + R/2)`` (GPT-NeoX, HF
            Llama), True for adjacent ``(2i, 2i + 1)`` (GPT-J, Meta's Llama).
        clockwise: rotate each pair by ``-theta`` instead of ``theta`` (NanoChat, whose
            ``rotate_half`` flips the signs): the transpose of the usual rotation, so scores
            still depend on ``m - n`` only, with the opposite sign. ``cos_sin`` returns the
            angles' cos and sin either way.
        max_len: cos/sin cache length built up front; longer positions grow it, up to
            ``max(max_len, TABLE_ROWS)`` rows; positions beyond are evaluated directly.
        length_policy: ``"monotone"`` or ``"transformers"`` (module docstring); only
            dynamic NTK and LongRoPE depend on it.
        layout: the axis order of ``forward``'s ``q`` and ``k``: ``"bhtd"`` for
            ``[B, H, T, D]``, ``"bthd"`` for ``[B, T, H, D]`` (returned in the same order).
            The hooks (``rotate``, as ``MultiHeadAttention`` calls it) always take
            ``[B, H, T, D]``.

    Raises:
        ValueError: odd ``head_dim``, odd or too large ``rotary_dim``, bad scaling, unknown
            ``length_policy`` or ``layout``.
    """

    sites = Site.QK

    def __init__(
        self,
        head_dim: int,
        *,
        base: float = DEFAULT_BASE,
        scaling: ScalingSpec = None,
        rotary_dim: int | None = None,
        interleaved: bool = False,
        max_len: int = 2048,
        length_policy: str = "monotone",
        clockwise: bool = False,
        layout: str = "bhtd",
    ) -> None:
        super().__init__()
        params, base, rotary_dim = resolve_scaling(
            scaling, head_dim=head_dim, base=base, rotary_dim=rotary_dim
        )
        if not isinstance(interleaved, bool):
            raise TypeError(f"interleaved must be a bool, got {interleaved!r}")
        self.head_dim, self.rotary_dim, self.base = head_dim, rotary_dim, base
        self.scaling, self.interleaved = params, interleaved
        self.clockwise = check_bool("clockwise", clockwise)
        self.max_len = check_int("max_len", max_len)
        if length_policy not in LENGTH_POLICIES:
            raise ValueError(
                f"length_policy must be one of {LENGTH_POLICIES}, got {length_policy!r}"
            )
        self.length_policy = length_policy
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        self.layout = layout
        inv_freq, scale = params.inv_freq(rotary_dim, base)
        self._state = _State(0, inv_freq, float(scale))
        self._lock = threading.Lock()
        self._freq_hooks: OrderedDict[int, Callable[[FrequencyChange], None]] = OrderedDict()

    # ------------------------------------------------------------------ frequencies

    @property
    def inv_freq(self) -> Tensor:
        """The current ``inv_freq [R/2]`` (float64)."""
        return self._state.inv_freq

    @property
    def attention_scale(self) -> float:
        """The current attention scale (multiplies cos and sin)."""
        return self._state.scale

    @property
    def seen_length(self) -> int:
        """Longest length the frequencies were chosen for (length-dependent scalings)."""
        return self._state.length

    def register_frequency_hook(self, hook: Callable[[FrequencyChange], None]) -> RemovableHandle:
        """Call ``hook(change)`` whenever the frequencies change; returns a removable handle."""
        handle = RemovableHandle(self._freq_hooks)
        self._freq_hooks[handle.id] = hook
        return handle

    def observe_length(self, length: int) -> FrequencyChange | None:
        """Record that positions up to ``length - 1`` are in use (see the length policy).

        Returns the change (also sent to the hooks) when the frequencies changed, else None.
        """
        length = check_int("length", length, minimum=0)
        if not self.scaling.length_dependent:
            return None
        return self._advance(length)[1]

    def reset_length(self) -> FrequencyChange | None:
        """Forget the lengths seen: back to the frequencies of the original length."""
        return self._set_length(lambda _: 0)[1]

    def sync_cache(self, cache: Any, length: int) -> None:
        """Length policy for a KV cache (dynamic NTK, LongRoPE; ``"monotone"`` policy).

        Observe ``length``; if the cached keys (``cache.keys``) were rotated with other
        frequencies than the current ones, re-rotate them (``rerotate_keys``) instead of
        discarding the cache. The record lives in the cache, so one encoding shared by
        several layers keeps every layer's cache consistent. ``rotate_cached`` does this
        and the rotation with one snapshot; prefer it.
        """
        if self.scaling.length_dependent:
            self._sync(cache, self._advance(length)[0])

    def rotate_cached(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, cache: Any
    ) -> tuple[Tensor, Tensor]:
        """``sync_cache`` then ``rotate``, both with one snapshot of the frequencies."""
        q_pos, k_pos = self._resolve(q, k, q_pos, k_pos)
        state = self._state
        if self.scaling.length_dependent:
            state = self._advance(_length_of(q_pos, k_pos))[0]
            self._sync(cache, state)
        return self._rotate(q, k, q_pos, k_pos, state)

    def _sync(self, cache: Any, state: _State) -> None:
        if self.length_policy != "monotone":
            return  # transformers does not re-rotate cached keys
        current = (state.inv_freq, state.scale)
        previous = cache.rotations.get(id(self))
        if len(cache) and previous is not None and not _same_frequencies(previous, current):
            sign = -1.0 if self.clockwise else 1.0  # by -theta: the negated frequencies
            old, new = ((sign * f, scale) for f, scale in (previous, current))
            cache.keys = rerotate_keys(
                cache.keys, cache.positions, old=old, new=new, interleaved=self.interleaved
            )
        cache.rotations[id(self)] = current

    def _next_length(self, seen: int, length: int) -> int:
        """The length the frequencies follow after a call reaching ``length``."""
        if self.length_policy == "monotone":
            return max(seen, length)
        if self.scaling.rope_type == "longrope":
            return length  # transformers: long or short factors from each call's length
        original = self.scaling.original_max_position_embeddings
        if length > seen:
            return length
        return 0 if length < original < seen else seen  # back to the original frequencies

    def _advance(self, length: int) -> tuple[_State, FrequencyChange | None]:
        return self._set_length(lambda seen: self._next_length(seen, length))

    def _set_length(self, rule: Callable[[int], int]) -> tuple[_State, FrequencyChange | None]:
        """Apply ``rule(seen) -> length`` atomically; returns the snapshot to use and the change."""
        with self._lock:
            old = self._state
            length = rule(old.length)
            if length == old.length:
                return old, None
            inv_freq, scale = self.scaling.inv_freq(
                self.rotary_dim, self.base, seq_len=length or None
            )
            same = float(scale) == old.scale and torch.equal(inv_freq, old.inv_freq)
            tables = old.tables if same else {}
            new = _State(length, old.inv_freq if same else inv_freq, float(scale), tables)
            self._state = new
        if same:
            return new, None
        change = FrequencyChange((old.inv_freq, old.scale), (inv_freq, float(scale)), length)
        for hook in list(self._freq_hooks.values()):
            hook(change)
        return new, change

    # ------------------------------------------------------------------ cos / sin

    def _table(
        self, state: _State, length: int, device: torch.device, dtype: torch.dtype
    ) -> tuple[Tensor, Tensor]:
        """Cached ``(cos, sin) [N >= length, R/2]`` of ``state`` for positions ``0..N-1``."""
        key = (device, dtype)
        cached = state.tables.get(key)
        if cached is None or cached[0].shape[0] < length:
            with self._lock:
                cached = state.tables.get(key)
                if cached is None or cached[0].shape[0] < length:
                    grown = 2 * cached[0].shape[0] if cached is not None else 0
                    rows = min(max(length, self.max_len, grown), self._table_limit)
                    positions = torch.arange(rows, device=device)
                    cached = rope_cos_sin(
                        positions, state.inv_freq, attention_scale=state.scale, dtype=dtype
                    )
                    state.tables[key] = cached  # swap in a new pair, never mutate one
        return cached

    def cos_sin(
        self, positions: Tensor, *, dtype: torch.dtype = torch.float32
    ) -> tuple[Tensor, Tensor]:
        """``(cos, sin)`` ``[..., R/2]`` for ``positions`` under the current frequencies.

        Float32 (float64 when ``dtype`` is float64); integer positions >= 0 come from the
        cache, others (and every position under ``torch.compile``, where reading the
        largest position would break the graph) are computed directly.
        """
        return self._cos_sin(self._state, positions, compute_dtype(dtype))

    def _cos_sin(
        self, state: _State, positions: Tensor, dtype: torch.dtype, *, start: int | None = None
    ) -> tuple[Tensor, Tensor]:
        """As ``cos_sin``; ``start``: ``positions`` are ``start, start + 1, ...`` (sliced)."""
        direct = positions.is_floating_point() or torch.compiler.is_compiling()  # no host sync
        if start is not None and not direct:
            return self._rows(state, start, start + positions.shape[-1], positions.device, dtype)
        if direct or positions.numel() == 0:
            return rope_cos_sin(positions, state.inv_freq, attention_scale=state.scale, dtype=dtype)
        low, high = (int(v) for v in positions.aminmax())
        if low < 0 or high >= self._table_limit:
            return rope_cos_sin(positions, state.inv_freq, attention_scale=state.scale, dtype=dtype)
        cos, sin = self._table(state, high + 1, positions.device, dtype)
        return cos[positions], sin[positions]

    def _rows(
        self, state: _State, start: int, end: int, device: torch.device, dtype: torch.dtype
    ) -> tuple[Tensor, Tensor]:
        """``(cos, sin)`` of positions ``start .. end - 1``: rows of the cached table. Those
        from 0 (a forward without positions or offset) are kept as views, keyed by their
        end beside the tables, so a repeated length costs one dictionary look-up."""
        key = (device, dtype, end) if start == 0 else None
        rows = state.tables.get(key)
        if rows is not None:
            return rows
        if not 0 <= start < end <= self._table_limit:
            positions = torch.arange(start, end, device=device)
            return rope_cos_sin(positions, state.inv_freq, attention_scale=state.scale, dtype=dtype)
        cos, sin = self._table(state, end, device, dtype)
        rows = cos[start:end], sin[start:end]
        if key is not None:
            state.tables[key] = rows
        return rows

    @property
    def _table_limit(self) -> int:
        return max(self.max_len, TABLE_ROWS)

    def _modulate(
        self, cos: Tensor, sin: Tensor, positions: Tensor, *, query: bool
    ) -> tuple[Tensor, Tensor]:
        """Hook for subclasses (xPos) that scale the rotation per position."""
        return cos, sin

    # ------------------------------------------------------------------ QK site

    def _check_qk(self, q: Tensor, k: Tensor, *, checked: bool = False) -> None:
        """Check ``q`` and ``k`` (``checked``: their type and ``ndim`` already are)."""
        if not checked:
            check_tensor("q", q, ndim=4)
            check_tensor("k", k, ndim=4)
        check_dense("q", q)
        check_dense("k", k)
        if q.shape[-1] != self.head_dim or k.shape[-1] != self.head_dim:
            raise ValueError(
                f"q and k must have head_dim={self.head_dim}, got q {tuple(q.shape)} "
                f"and k {tuple(k.shape)}"
            )
        if q.shape[0] != k.shape[0]:
            raise ValueError(f"q has batch {q.shape[0]} but k has batch {k.shape[0]}")

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        """Rotate ``q [B, H, Tq, D]`` at ``q_pos`` and ``k [B, Hkv, Tk, D]`` at ``k_pos``.

        Positions are ``[T]`` or ``[B, T]``, integer or float. Returns new tensors.

        Raises:
            ValueError: head_dim or batch mismatch, positions not of length ``Tq`` / ``Tk``.
        """
        q_pos, k_pos = self._resolve(q, k, q_pos, k_pos)
        state = self._state
        if self.scaling.length_dependent:
            state = self._advance(_length_of(q_pos, k_pos))[0]
        return self._rotate(q, k, q_pos, k_pos, state)

    def _resolve(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        self._check_qk(q, k)
        same = q_pos is k_pos
        q_pos = resolve_positions(q_pos, q.shape[-2], batch=q.shape[0], name="q_pos").to(q.device)
        if same and q.shape[-2] == k.shape[-2] and q.device == k.device:
            return q_pos, q_pos
        k_pos = resolve_positions(k_pos, k.shape[-2], batch=k.shape[0], name="k_pos").to(k.device)
        return q_pos, k_pos

    def _rotate(
        self,
        q: Tensor,
        k: Tensor,
        q_pos: Tensor,
        k_pos: Tensor,
        state: _State,
        *,
        start: int | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Rotate with one snapshot ``state``: q and k see the same frequencies.

        ``start``: the positions are consecutive, ``k_pos`` from ``k_pos[0]`` and ``q_pos``
        from ``start`` (``_rotate_span``), so their tables can be sliced."""
        q_dtype, k_dtype = compute_dtype(q.dtype), compute_dtype(k.dtype)
        k_start = None if start is None else start - k.shape[-2] + q.shape[-2]
        cos_q, sin_q = self._cos_sin(state, q_pos, q_dtype, start=start)
        same = q_pos is k_pos and q_dtype == k_dtype
        cos_k, sin_k = (
            (cos_q, sin_q) if same else self._cos_sin(state, k_pos, k_dtype, start=k_start)
        )
        cos_q, sin_q = self._modulate(cos_q, sin_q, q_pos, query=True)
        cos_k, sin_k = self._modulate(cos_k, sin_k, k_pos, query=False)
        if self.clockwise:
            sin_q, sin_k = -sin_q, -sin_k
        q = rotate_checked(q, cos_q, sin_q, self.interleaved)  # checked by _check_qk
        k = rotate_checked(k, cos_k, sin_k, self.interleaved)
        return q, k

    def forward(
        self, q: Tensor, k: Tensor, positions: Tensor | None = None, *, offset: int = 0
    ) -> tuple[Tensor, Tensor]:
        """Rotate ``q [B, H, Tq, D]`` and ``k [B, Hkv, Tk, D]`` (``[B, T, H, D]`` with
        ``layout="bthd"``); returns them in the same layout.

        Args:
            q: queries.
            k: keys.
            positions: ``[T]`` or ``[B, T]`` positions shared by q and k (needs
                ``Tq == Tk``); None means ``arange(Tk)``, the queries being the last
                ``Tq`` of them. Without positions, ``layout="bhtd"`` tensors that look
                like ``[B, T, H, D]`` (``posenc.base.check_token_axis``: grouped heads
                on axis 2, or q and k of one shape with more heads than tokens) are
                refused, since their head axis would be rotated as positions.
            offset: added to the positions (KV-cache decoding: the cached length).

        Raises:
            ValueError: see ``rotate``; ``Tq > Tk``, or ``Tq != Tk`` with positions;
                ``[B, T, H, D]``-looking tensors without positions (the message names
                ``layout="bthd"`` and positions as the ways out);
                positions whose length is not the ``T`` axis of the layout (the message
                names the shape).
        """
        check_tensor("q", q, ndim=4)
        check_tensor("k", k, ndim=4)
        if self.layout == "bthd":
            q, k = self._forward(q.transpose(1, 2), k.transpose(1, 2), positions, offset)
            return q.transpose(1, 2), k.transpose(1, 2)
        return self._forward(q, k, positions, offset)

    def _forward(
        self, q: Tensor, k: Tensor, positions: Tensor | None, offset: int
    ) -> tuple[Tensor, Tensor]:
        """``forward`` on ``[B, H, T, D]`` views."""
        self._check_qk(q, k, checked=True)
        offset = check_int("offset", offset, minimum=0)
        t_q, t_k = q.shape[-2], k.shape[-2]
        if positions is None:
            if self.layout == "bhtd":
                check_token_axis(q, k, fix=_layout_fix(type(self)), offset=offset)
            elif t_q > t_k:
                raise ValueError(f"q is longer than k ({t_q} > {t_k}); pass positions")
            return self._rotate_span(q, k, offset)
        if t_q != t_k:
            raise ValueError(f"positions are shared, but q has T={t_q} and k has T={t_k}")
        if isinstance(positions, Tensor) and positions.dim() in (1, 2):
            self._check_length(positions, q)
        positions = resolve_positions(positions, t_q, batch=q.shape[0])
        positions = positions + offset if offset else positions
        return self.rotate(q, k, positions, positions)

    def _rotate_span(self, q: Tensor, k: Tensor, offset: int) -> tuple[Tensor, Tensor]:
        """``forward`` without positions: keys at ``offset .. offset + Tk - 1``, queries the
        last ``Tq`` of them. Their cos/sin are rows of the cached table, sliced, not
        gathered: a gather costs as much as the rotation of a small q and k, and on a
        loaded machine its thread split waits for a core."""
        t_q, t_k = q.shape[-2], k.shape[-2]
        k_pos = _arange(offset, offset + t_k, k.device)
        q_pos = k_pos if t_q == t_k else k_pos[t_k - t_q :]
        if type(self).rotate is not RotaryEmbedding.rotate:  # a subclass's own rotation
            return self.rotate(q, k, q_pos, k_pos)
        state = self._state
        if self.scaling.length_dependent:
            state = self._advance(offset + t_k)[0]
        return self._rotate(q, k, q_pos, k_pos, state, start=offset + t_k - t_q)

    def _check_length(self, positions: Tensor, q: Tensor) -> None:
        """Refuse positions whose length is not the layout's ``T`` axis of ``q``."""
        n, t_q = positions.shape[-1], q.shape[-2]
        if n == t_q:
            return
        shown = q.transpose(1, 2) if self.layout == "bthd" else q
        order = "[B, T, H, D]" if self.layout == "bthd" else "[B, H, T, D]"
        hint = ""
        if n == q.shape[1]:  # the positions fit the other axis: the other layout
            other = "bhtd" if self.layout == "bthd" else "bthd"
            hint = f"; for the other axis order pass layout={other!r}"
        raise ValueError(
            f"positions must have shape [T] or [B, T] with T = {t_q}, got shape "
            f"{tuple(positions.shape)}: q {tuple(shown.shape)} has T={t_q} in "
            f"layout={self.layout!r} {order}{hint}"
        )

    # ------------------------------------------------------------------ copying

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        del state["_lock"]
        state["_state"] = replace(self._state, tables={})
        state["_freq_hooks"] = OrderedDict()  # hooks belong to the original's cache owner
        return state

    def __setstate__(self, state: dict) -> None:
        state.setdefault("length_policy", "monotone")
        state.setdefault("clockwise", False)
        state.setdefault("layout", "bhtd")
        super().__setstate__(state)
        self._lock = threading.Lock()

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base}, "
            f"scaling={self.scaling}, interleaved={self.interleaved}"
            + (", clockwise=True" if self.clockwise else "")
            + (f", layout={self.layout!r}" if self.layout != "bhtd" else "")
            + (f", length_policy={self.length_policy!r}" if self.scaling.length_dependent else "")
        )


@functools.lru_cache(maxsize=64)
def _arange(start: int, end: int, device: torch.device) -> Tensor:
    """``arange(start, end)`` on ``device``, kept for the next call of the same span (a
    forward without positions; never written to)."""
    return torch.arange(start, end, device=device)


@functools.cache
def _layout_fix(cls: type) -> str:
    """How a user of ``cls`` rotates ``[B, T, H, D]`` tensors (for an error message)."""
    if "layout" in inspect.signature(cls).parameters:
        return f"pass {cls.__name__}(..., layout='bthd')"
    return "transpose them to [B, H, T, D]"


def _length_of(q_pos: Tensor, k_pos: Tensor) -> int:
    """``max(position) + 1`` over queries and keys (floor for float positions)."""
    highs = [float(p.max()) for p in (q_pos, k_pos) if p.numel()]
    return max(math.floor(max(highs)) + 1, 0) if highs else 0


def _same_frequencies(a: Frequencies, b: Frequencies) -> bool:
    return a[1] == b[1] and torch.equal(a[0], b[0])
