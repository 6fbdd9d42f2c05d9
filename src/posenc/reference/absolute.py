"""Float64 NumPy reference for the absolute encodings: sinusoidal and learned.

Shapes: ``B`` batch, ``L`` length, ``d`` d_model (``C`` in the torch code).

Sinusoidal (Vaswani et al. 2017, "Attention Is All You Need", section 3.5)::

    PE[p, 2i]     = sin(p * w_i)
    PE[p, 2i + 1] = cos(p * w_i),     w_i = exp(-(2i / d) * ln(base)) = base ** (-2i / d)

with the frequencies computed in log space. Learned (Gehring et al. 2017, "Convolutional
Sequence to Sequence Learning"; Radford et al. 2019, GPT-2): a trainable table
``E [L_max, d]`` added to the input, ``Y = X + E[:L]``, so that
``dLoss/dE[p] = sum_b dLoss/dY[b, p]`` and ``dLoss/dX = dLoss/dY``.

This is the oracle the torch modules are tested against: plain NumPy written from the
formulas, independent of ``posenc.encodings``.
"""

from __future__ import annotations

import numpy as np

from posenc._checks import check_even, check_float, check_int

__all__ = [
    "LearnedPositionalEncoding",
    "SinusoidalPositionalEncoding",
    "interpolate_table",
    "sinusoidal_frequencies",
    "sinusoidal_positional_encoding",
    "sinusoidal_positional_encoding_at",
]


def sinusoidal_frequencies(d_model: int, *, base: float = 10000.0) -> np.ndarray:
    """Angular frequencies ``w_i = exp(-(2i / d) ln(base))``, ``i < d/2``, as ``[d/2]``.

    Raises:
        ValueError: ``d_model`` odd or < 1, ``base`` <= 0.
    """
    d_model = check_even("d_model", d_model)
    base = check_float("base", base, positive=True)
    i = np.arange(d_model // 2, dtype=np.float64)
    return np.exp(-2.0 * i / d_model * np.log(base))


def sinusoidal_positional_encoding_at(
    positions: np.ndarray, d_model: int, *, base: float = 10000.0
) -> np.ndarray:
    """Sinusoidal encodings of arbitrary (integer or real) ``positions [...]``.

    Returns:
        ``[..., d]`` float64, sin in the even columns and cos in the odd ones.

    Raises:
        ValueError: ``d_model`` odd or < 1, ``base`` <= 0.
    """
    omega = sinusoidal_frequencies(d_model, base=base)
    angles = np.asarray(positions, dtype=np.float64)[..., None] * omega  # [..., d/2]
    pe = np.empty((*angles.shape[:-1], d_model), dtype=np.float64)
    pe[..., 0::2] = np.sin(angles)
    pe[..., 1::2] = np.cos(angles)
    return pe


def sinusoidal_positional_encoding(
    seq_len: int, d_model: int, *, base: float = 10000.0
) -> np.ndarray:
    """The sinusoidal table ``[L, d]`` of positions ``0 .. seq_len - 1``.

    Raises:
        ValueError: ``seq_len`` < 1, ``d_model`` odd or < 1, ``base`` <= 0.
    """
    seq_len = check_int("seq_len", seq_len)
    return sinusoidal_positional_encoding_at(np.arange(seq_len), d_model, base=base)


def interpolate_table(table: np.ndarray, length: int) -> np.ndarray:
    """Linearly resample ``table [L, d]`` along positions to ``[length, d]``.

    The semantics of ``torch.nn.functional.interpolate(mode="linear",
    align_corners=False)``: output row ``j`` reads the source coordinate
    ``s = (j + 0.5) * L / length - 0.5``, clamped below at 0, between rows
    ``floor(s)`` and ``min(floor(s) + 1, L - 1)``.

    Raises:
        ValueError: ``table`` not 2-D or empty, ``length`` < 1.
    """
    table = np.asarray(table, dtype=np.float64)
    if table.ndim != 2 or table.shape[0] < 1:
        raise ValueError(f"table must have shape [L, d] with L >= 1, got shape {table.shape}")
    length = check_int("length", length)
    src_len = table.shape[0]
    source = (np.arange(length, dtype=np.float64) + 0.5) * (src_len / length) - 0.5
    source = np.maximum(source, 0.0)
    lo = np.floor(source).astype(np.int64)
    hi = np.minimum(lo + 1, src_len - 1)
    frac = (source - lo)[:, None]
    return (1.0 - frac) * table[lo] + frac * table[hi]


def _check_input(X: np.ndarray, d_model: int, max_seq_len: int | None) -> np.ndarray:
    """Validate ``X [B, L, d]`` against the model width and (if given) the table length."""
    X = np.asarray(X)
    if X.ndim != 3:
        raise ValueError(f"X must have shape [B, L, d_model], got shape {X.shape}")
    if X.shape[2] != d_model:
        raise ValueError(f"X has last dimension {X.shape[2]}, expected d_model={d_model}")
    if max_seq_len is not None and X.shape[1] > max_seq_len:
        raise ValueError(f"sequence length {X.shape[1]} exceeds max_seq_len {max_seq_len}")
    return X


class SinusoidalPositionalEncoding:
    """The sinusoidal table precomputed for ``max_seq_len`` positions, added to inputs.

    Args:
        max_seq_len: number of positions precomputed (and the longest input accepted).
        d_model: the model width ``d`` (even).
        base: the frequency base (10000 in the paper).

    Raises:
        ValueError: ``max_seq_len`` < 1, ``d_model`` odd or < 1, ``base`` <= 0.
    """

    def __init__(self, max_seq_len: int, d_model: int, *, base: float = 10000.0) -> None:
        self.max_seq_len = check_int("max_seq_len", max_seq_len)
        self.d_model = check_even("d_model", d_model)
        self.pe = sinusoidal_positional_encoding(self.max_seq_len, self.d_model, base=base)

    def forward(self, X: np.ndarray) -> np.ndarray:
        """``X [B, L, d]`` -> ``X + PE[:L]`` (the table broadcast over the batch).

        Raises:
            ValueError: ``X`` not 3-D, wrong width, or ``L > max_seq_len``.
        """
        X = _check_input(X, self.d_model, self.max_seq_len)
        return X + self.pe[: X.shape[1]]

    def get_encoding(self, seq_len: int) -> np.ndarray:
        """The first ``seq_len`` rows of the table, ``[seq_len, d]`` (a copy).

        Raises:
            ValueError: ``seq_len`` < 1 or > ``max_seq_len``.
        """
        seq_len = check_int("seq_len", seq_len)
        if seq_len > self.max_seq_len:
            raise ValueError(f"seq_len {seq_len} exceeds max_seq_len {self.max_seq_len}")
        return self.pe[:seq_len].copy()


class LearnedPositionalEncoding:
    """A trainable table ``embedding [L_max, d]`` added to inputs, with an explicit backward.

    Args:
        max_seq_len: number of rows ``L_max``.
        d_model: the model width ``d``.
        std: standard deviation of the normal initialisation (0.02, as in GPT-2).
        seed: seed of the initialisation (``numpy.random.default_rng``); ignored when
            ``rng`` is given.
        rng: a generator to draw the initial table from.

    Attributes:
        embedding: the table ``[L_max, d]`` (float64).
        grad_embedding: its gradient after ``backward``, zero in the rows not used.

    Raises:
        ValueError: ``max_seq_len`` or ``d_model`` < 1, ``std`` < 0.
    """

    def __init__(
        self,
        max_seq_len: int,
        d_model: int,
        *,
        std: float = 0.02,
        seed: int | None = None,
        rng: np.random.Generator | None = None,
    ) -> None:
        self.max_seq_len = check_int("max_seq_len", max_seq_len)
        self.d_model = check_int("d_model", d_model)
        std = check_float("std", std, minimum=0.0)
        rng = rng if rng is not None else np.random.default_rng(seed)
        self.embedding = rng.standard_normal((self.max_seq_len, self.d_model)) * std
        self.grad_embedding = np.zeros_like(self.embedding)
        self._positions: np.ndarray | None = None
        self._out_shape: tuple[int, ...] | None = None

    def forward(self, X: np.ndarray, positions: np.ndarray | None = None) -> np.ndarray:
        """``X [B, L, d]`` -> ``X + E[positions]``; positions default to ``0 .. L - 1``.

        Args:
            X: the input ``[B, L, d]``.
            positions: integer rows to add, ``[L]`` (shared) or ``[B, L]``.

        Raises:
            ValueError: ``X`` not 3-D or of the wrong width, ``L`` or a position beyond
                the table, negative positions, ``positions`` of the wrong shape.
        """
        if positions is None:
            X = _check_input(X, self.d_model, self.max_seq_len)
            positions = np.arange(X.shape[1])
        else:
            X = _check_input(X, self.d_model, None)
            positions = self._check_positions(np.asarray(positions), X.shape[:2])
        out = X + self.embedding[positions]  # [L, d] or [B, L, d], broadcast over B
        self._positions, self._out_shape = positions, out.shape
        return out

    def backward(self, grad_output: np.ndarray) -> np.ndarray:
        """Gradients of the last ``forward``: fills ``grad_embedding``, returns ``dLoss/dX``.

        Every row of ``grad_embedding`` is recomputed: the upstream gradient summed over
        the batch (and over repeated positions) in the rows used, zero elsewhere.

        Returns:
            a copy of ``grad_output`` (addition passes the gradient through).

        Raises:
            RuntimeError: called before ``forward``.
            ValueError: ``grad_output`` not of the forward output's shape.
        """
        if self._positions is None:
            raise RuntimeError("backward called before forward")
        grad_output = np.asarray(grad_output, dtype=np.float64)
        if grad_output.shape != self._out_shape:
            raise ValueError(
                f"grad_output has shape {grad_output.shape}, expected {self._out_shape}"
            )
        grad = np.zeros_like(self.embedding)
        if self._positions.ndim == 1:
            np.add.at(grad, self._positions, grad_output.sum(axis=0))
        else:
            np.add.at(grad, self._positions, grad_output)
        self.grad_embedding = grad
        return grad_output.copy()

    def interpolated(self, seq_len: int) -> np.ndarray:
        """The table linearly resampled to ``seq_len`` rows (see ``interpolate_table``)."""
        return interpolate_table(self.embedding, seq_len)

    def _check_positions(self, positions: np.ndarray, batch_len: tuple[int, int]) -> np.ndarray:
        batch, seq_len = batch_len
        if not np.issubdtype(positions.dtype, np.integer):
            raise TypeError(f"positions must be integers, got dtype {positions.dtype}")
        if positions.ndim not in (1, 2) or positions.shape[-1] != seq_len:
            raise ValueError(
                f"positions must be [L] or [B, L] with L={seq_len}, got {positions.shape}"
            )
        if positions.ndim == 2 and positions.shape[0] != batch:
            raise ValueError(f"positions have batch {positions.shape[0]}, X has batch {batch}")
        if positions.size and (positions.min() < 0 or positions.max() >= self.max_seq_len):
            raise ValueError(
                f"positions must lie in [0, {self.max_seq_len}), got min {positions.min()} "
                f"and max {positions.max()}"
            )
        return positions
