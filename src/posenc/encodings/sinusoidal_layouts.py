"""Sinusoidal encodings in the layouts real checkpoints use, not only the paper's.

Shapes: ``B`` batch, ``T`` length, ``C`` d_model, ``h = C / 2``. Position ``p`` (shifted by
``offset``) gets the angles ``a_i = (p + offset) * w_i``, ``i = 0 .. h - 1``, with

    spacing "paper":          w_i = base ** (-i / h)        (Vaswani et al. 2017, sec. 3.5)
    spacing "tensor2tensor":  w_i = base ** (-i / (h - 1))  (tensor2tensor and fairseq)

laid out as

    "interleaved":  [sin a_0, cos a_0, sin a_1, cos a_1, ...]   (the paper; posenc's default)
    "sin|cos":      [sin a_0 .. sin a_{h-1} | cos a_0 .. cos a_{h-1}]   (Marian, Pegasus,
                    fairseq's M2M100 / NLLB / Speech2Text / XGLM, Whisper's encoder)
    "cos|sin":      [cos ... | sin ...]   (MusicGen)

fairseq-derived models start counting at ``padding_idx + 1`` (``offset = 2``), and the
angle is taken at the shifted position. The angles are computed in float64 and rounded
once; the checkpoints' own code computes them in float32, so its values differ from these
by about ``|a| * 2^-24`` (more exact here, not different in kind).
"""

from __future__ import annotations

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
from posenc.base import PositionalEncoding, Site

__all__ = ["LAYOUTS", "SPACINGS", "SinusoidalLayout", "sinusoidal_layout_table"]

LAYOUTS = ("interleaved", "sin|cos", "cos|sin")
SPACINGS = ("paper", "tensor2tensor")


def _choice(name: str, value: object, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")
    return value  # type: ignore[return-value]


def sinusoidal_layout_table(
    positions: Tensor,
    d_model: int,
    *,
    base: float = 10000.0,
    layout: str = "sin|cos",
    spacing: str = "paper",
    offset: int = 0,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Encodings ``[..., C]`` of integer or float ``positions [...]`` (module docstring).

    Raises:
        ValueError: odd or non-positive ``d_model`` (``C = 2`` with "tensor2tensor"
            spacing, whose ``h - 1`` is 0), an unknown ``layout`` or ``spacing``.
        TypeError: bad positions, a non-integer ``offset``, a non-floating ``dtype``.
    """
    positions = check_positions(positions)
    d_model = check_even("d_model", d_model)
    base = check_float("base", base, positive=True)
    layout = _choice("layout", layout, LAYOUTS)
    spacing = _choice("spacing", spacing, SPACINGS)
    offset = check_int("offset", offset, minimum=0)
    dtype = check_float_dtype("dtype", dtype)
    half = d_model // 2
    steps = half if spacing == "paper" else half - 1
    if steps < 1:
        raise ValueError(f"d_model={d_model} is too small for {spacing!r} spacing")
    i = torch.arange(half, dtype=torch.float64, device=positions.device)
    inv_freq = torch.exp(i * (-torch.log(torch.tensor(base, dtype=torch.float64)) / steps))
    exact = float_positions(positions, torch.float64) + offset
    angles = exact.unsqueeze(-1) * inv_freq  # [..., h]
    if layout == "interleaved":
        table = torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)
    elif layout == "sin|cos":
        table = torch.cat((angles.sin(), angles.cos()), dim=-1)
    else:
        table = torch.cat((angles.cos(), angles.sin()), dim=-1)
    return table.to(dtype)


class SinusoidalLayout(PositionalEncoding):
    """Adds a sinusoidal table in a checkpoint's layout to ``x [B, T, C]``.

    Not a registered name: ``posenc.hf.build_position_module`` builds it from a config.
    The table is evaluated directly at the positions asked for (``O(T C)`` per call,
    nothing cached, so a position's cost does not depend on its value).

    Args:
        d_model: ``C`` (even).
        base: frequency base (10000 in every family here).
        layout: "interleaved", "sin|cos" or "cos|sin".
        spacing: "paper" or "tensor2tensor" (module docstring).
        offset: added to every position before the angle (2 in fairseq's models).
        dropout: dropout after the addition.

    Raises:
        ValueError: an odd ``d_model``, an unknown ``layout``/``spacing``, a negative
            ``offset``, a dropout outside [0, 1).
    """

    sites = Site.INPUT

    def __init__(
        self,
        d_model: int,
        *,
        base: float = 10000.0,
        layout: str = "sin|cos",
        spacing: str = "paper",
        offset: int = 0,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.d_model = check_even("d_model", d_model)
        self.base = check_float("base", base, positive=True)
        self.layout = _choice("layout", layout, LAYOUTS)
        self.spacing = _choice("spacing", spacing, SPACINGS)
        self.offset = check_int("offset", offset, minimum=0)
        self.dropout = nn.Dropout(check_probability("dropout", dropout))
        self.encoding(torch.zeros(1, dtype=torch.int64))  # d_model too small: raise now

    def encoding(self, positions: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
        """Encodings ``[..., C]`` in ``dtype`` for integer or float ``positions [...]``."""
        return sinusoidal_layout_table(
            positions,
            self.d_model,
            base=self.base,
            layout=self.layout,
            spacing=self.spacing,
            offset=self.offset,
            dtype=dtype,
        )

    def embed(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        check_tensor("x", x, ndim=3)
        if x.shape[-1] != self.d_model:
            raise ValueError(f"x has last dimension {x.shape[-1]}, expected d_model={self.d_model}")
        positions = resolve_positions(positions, x.shape[1], batch=x.shape[0], device=x.device)
        work = compute_dtype(x.dtype)
        pe = self.encoding(positions.to(x.device), work)  # [T, C] or [B, T, C]
        return self.dropout(torch.add(x, pe.to(x.dtype)))

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        """Same as ``embed``: ``x [B, T, C]`` -> ``x + PE [B, T, C]``."""
        return self.embed(x, positions)

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, layout={self.layout!r}, spacing={self.spacing!r}, "
            f"offset={self.offset}"
        )
