"""Sinusoidal absolute positional encoding (Vaswani et al. 2017, "Attention Is All You
Need", section 3.5).

    PE[p, 2i]     = sin(p * w_i)
    PE[p, 2i + 1] = cos(p * w_i),      w_i = base ** (-2i / C)

Shapes: ``B`` batch, ``T`` length, ``C`` d_model. The table is computed in float64 from
the formula (angles never in the input's dtype), cached per device in float32 (float64
for float64 inputs) and grown when a longer sequence arrives; it is not a buffer, so
``module.to(torch.bfloat16)`` cannot degrade it. The addition happens in the input's dtype
with the table cast once.

Negative positions: allowed; ``PE[p]`` follows the formula (a negative angle), computed
directly instead of read from the cache. So are positions at or beyond
``max(max_len, TABLE_ROWS)``: the cache is bounded, and the cost follows the number of
positions asked for, not their value.
"""

from __future__ import annotations

import threading

import torch
from torch import Tensor, nn

from posenc._checks import (
    check_even,
    check_float,
    check_float_dtype,
    check_int,
    check_positions,
    check_probability,
    check_tensor,
    float_positions,
    resolve_positions,
)
from posenc._dtypes import compute_dtype
from posenc.base import PositionalEncoding, Site, register

__all__ = ["TABLE_ROWS", "SinusoidalPositionalEncoding", "sinusoidal_table"]

#: Rows cached at most per (device, dtype) beyond ``max_len``.
TABLE_ROWS = 1 << 16

#: Guards cache growth; module-level so that instances stay picklable and deep-copyable.
_LOCK = threading.Lock()


def sinusoidal_table(
    positions: Tensor, d_model: int, *, base: float = 10000.0, dtype: torch.dtype = torch.float32
) -> Tensor:
    """Sinusoidal encodings of arbitrary (integer or float) ``positions [...]``.

    Returns ``[..., C]`` in ``dtype``; angles are computed in float64 and rounded once.
    """
    positions = check_positions(positions)
    dtype = check_float_dtype("dtype", dtype)
    d_model = check_even("d_model", d_model)
    base = check_float("base", base, positive=True)
    exponent = torch.arange(0, d_model, 2, dtype=torch.float64, device=positions.device)
    inv_freq = torch.exp(exponent * (-torch.log(torch.tensor(base, dtype=torch.float64)) / d_model))
    angles = float_positions(positions, torch.float64).unsqueeze(-1) * inv_freq  # [..., C/2]
    table = torch.stack((angles.sin(), angles.cos()), dim=-1)  # [..., C/2, 2]
    return table.flatten(-2).to(dtype)  # interleaved: sin at 2i, cos at 2i + 1


@register(
    "sinusoidal",
    paper="Vaswani et al. 2017, Attention Is All You Need (sec. 3.5)",
    description="fixed sin/cos of geometrically spaced frequencies added to the embeddings",
)
class SinusoidalPositionalEncoding(PositionalEncoding):
    """Adds the sinusoidal table to token embeddings ``x [B, T, C]``.

    Args:
        d_model: embedding width ``C`` (even).
        max_len: length precomputed up front; longer inputs grow the cache.
        base: the frequency base (10000 in the paper).
        dropout: dropout applied after the addition.

    Raises:
        ValueError: odd or non-positive ``d_model``, non-positive ``max_len`` or ``base``.
    """

    sites = Site.INPUT

    def __init__(
        self, d_model: int, *, max_len: int = 2048, base: float = 10000.0, dropout: float = 0.0
    ) -> None:
        super().__init__()
        self.d_model = check_even("d_model", d_model)
        self.max_len = check_int("max_len", max_len)
        self.base = check_float("base", base, positive=True)
        self.dropout = nn.Dropout(check_probability("dropout", dropout))
        self._tables: dict[tuple[torch.device, torch.dtype], Tensor] = {}

    def table(
        self,
        seq_len: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> Tensor:
        """The table ``[seq_len, C]`` for positions ``0 .. seq_len - 1`` (cached).

        ``dtype`` is float32 or float64 (the two precisions cached); other dtypes get
        the float32 table cast once.
        """
        seq_len = check_int("seq_len", seq_len, minimum=0)
        if dtype not in (torch.float32, torch.float64):
            return self.table(seq_len, device).to(dtype)
        device = torch.device(device or "cpu")
        if seq_len > self._table_limit:  # too long to keep: computed, not cached
            positions = torch.arange(seq_len, device=device)
            return sinusoidal_table(positions, self.d_model, base=self.base, dtype=dtype)
        key = (device, dtype)
        cached = self._tables.get(key)
        if cached is None or cached.shape[0] < seq_len:
            with _LOCK:
                cached = self._tables.get(key)
                if cached is None or cached.shape[0] < seq_len:
                    grown = 2 * (cached.shape[0] if cached is not None else 0)
                    length = min(max(seq_len, self.max_len, grown), self._table_limit)
                    positions = torch.arange(length, device=device)
                    cached = sinusoidal_table(positions, self.d_model, base=self.base, dtype=dtype)
                    self._tables[key] = cached  # swap in a new tensor, never mutate
        return cached[:seq_len]

    def encoding(self, positions: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
        """Encodings ``[..., C]`` in ``dtype`` for integer or float ``positions [...]``."""
        direct = positions.is_floating_point() or positions.numel() == 0
        if direct or positions.min() < 0 or positions.max() >= self._table_limit:
            return sinusoidal_table(positions, self.d_model, base=self.base, dtype=dtype)
        return self.table(int(positions.max()) + 1, positions.device, dtype)[positions]

    @property
    def _table_limit(self) -> int:
        return max(self.max_len, TABLE_ROWS)

    def embed(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        check_tensor("x", x, ndim=3)
        if x.shape[-1] != self.d_model:
            raise ValueError(f"x has last dimension {x.shape[-1]}, expected d_model={self.d_model}")
        dtype = compute_dtype(x.dtype)
        if positions is None:
            pe = self.table(x.shape[1], x.device, dtype)  # [T, C]
        else:
            positions = resolve_positions(positions, x.shape[1], batch=x.shape[0])
            pe = self.encoding(positions.to(x.device), dtype)  # [T, C] or [B, T, C]
        return self.dropout(torch.add(x, pe.to(x.dtype)))

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        """Same as ``embed``: ``x [B, T, C]`` -> ``x + PE [B, T, C]``."""
        return self.embed(x, positions)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, max_len={self.max_len}, base={self.base}"
