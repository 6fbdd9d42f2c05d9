"""FoPE, Fourier position embedding: every rotary pair carries a Fourier series over the
RoPE frequencies, with learned per-head coefficients, and the frequencies too low to be
trained are clipped to zero (Hua et al. 2025, "Fourier Position Embedding: Enhancing
Attention's Periodic Extension for Length Generalization", ICML, arXiv 2412.17739, sec. 5).

Shapes: ``B`` batch, ``H`` heads, ``Hc`` heads with their own coefficients, ``T`` length,
``D`` head_dim, ``P = D/2`` pairs, ``F`` kept frequencies. ``theta_i = base ** (-2i/D)``.

Clipping (the paper's floor frequency ``2 pi / L``, ``L`` the training length): pairs with
``theta_i <= 2 pi / L`` turn less than once over the training length; they are set to zero
frequency, so only the first ``F`` pairs (``theta_i > 2 pi / L``) keep a frequency, or
the first ``num_inv_freq`` when that is given. At position ``m`` pair ``j < F`` uses

    cos'_j(m) = sum_i C^cos[h, i, j] cos(m theta_i)
    sin'_j(m) = sum_i C^sin[h, i, j] sin(m theta_i)

(``i < F``), and a clipped pair ``j >= F`` uses ``cos' = 1``, ``sin' = 0`` (zero
frequency: it passes unchanged). The pair ``(a, b)`` maps to ``(a cos' - b sin', a sin' +
b cos')`` as in RoPE; with ``C^cos = C^sin = I`` and nothing clipped this is RoPE.
Coefficients start at ``I + N(0, sigma^2)`` (the paper: each pair's own frequency with
weight 1 plus random weights on the others).

This follows the inference definition of the released FoPE model, Intern-S1-Pro, in the
SGLang and vLLM code (coefficients ``[Hkv, F, F]`` per key/value head, or one shared set,
used as stored; a query head uses the set of its key/value group). That code, like the
authors' appendix listing, pads the clipped pairs' sine with 1 instead of 0 (the same
45-degree turn, scaled by sqrt 2, at every position; a vLLM test calls it a bug): posenc
follows the paper's zero frequency by default and the released code with
``clipped_sin=1``. The listing also divides each coefficient column by its sum; the
released model's code does not, and neither does posenc.

The map is not a rotation (``cos'^2 + sin'^2 != 1``) and a query-key product is not a
function of the offset alone; each key depends on its own position only, so a KV cache of
transformed keys decodes exactly as a full forward.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from posenc._checks import (
    check_bool,
    check_even,
    check_float,
    check_int,
    check_positions,
    float_positions,
)
from posenc._dtypes import compute_dtype
from posenc.base import PositionalEncoding, Site, register
from posenc.encodings.rotary._shapes import check_qk
from posenc.encodings.rotary.apply import apply_rope
from posenc.encodings.rotary.scaling import DEFAULT_BASE, base_inv_freq

__all__ = ["FourierRope", "fope_frequencies"]

DEFAULT_SIGMA = 0.3  # the authors' listing (rope_fourier_init_norm_gain) and 60M models


def fope_frequencies(
    head_dim: int,
    *,
    base: float = DEFAULT_BASE,
    max_len: int | None = None,
    num_inv_freq: int | None = None,
) -> Tensor:
    """The kept frequencies ``theta_i``, float64 ``[F]``: all ``D/2`` (no clipping), the
    first ``num_inv_freq``, or those above the floor ``2 pi / max_len``.

    Raises:
        ValueError: odd ``head_dim``; ``num_inv_freq`` outside ``[1, D/2]``; ``max_len``
            below 1; a floor that clips every pair.
    """
    inv_freq = base_inv_freq(check_even("head_dim", head_dim), base)
    if num_inv_freq is not None:
        kept = check_int("num_inv_freq", num_inv_freq)
        if kept > head_dim // 2:
            raise ValueError(f"num_inv_freq={kept} exceeds the {head_dim // 2} pairs of head_dim")
        return inv_freq[:kept]
    if max_len is None:
        return inv_freq
    floor = 2.0 * math.pi / check_int("max_len", max_len)
    kept_freq = inv_freq[inv_freq > floor]
    if not kept_freq.numel():
        raise ValueError(
            f"max_len={max_len} clips every pair (floor 2 pi / max_len = {floor:.3g} is above "
            f"the highest frequency 1)"
        )
    return kept_freq


@register(
    "fope",
    paper="Hua et al. 2025, Fourier Position Embedding (ICML, arXiv 2412.17739, sec. 5)",
    description="RoPE pairs as learned Fourier series over the frequencies, low ones clipped",
)
class FourierRope(PositionalEncoding):
    """FoPE on queries ``[B, H, Tq, D]`` and keys ``[B, Hkv, Tk, D]`` at positions ``[T]`` /
    ``[B, T]`` (module docstring).

    Args:
        head_dim: ``D``, even; the whole head is transformed.
        coef_heads: ``Hc``, coefficient sets: 1 (the default) shares one set among all
            heads; the key/value heads give each its own (Intern-S1-Pro's
            ``fope_sep_head``), a query head using the set of its group. Query and key
            heads must be multiples of it (head ``h`` uses set ``h // (heads / Hc)``).
        base: the RoPE base.
        max_len: the training length ``L``; pairs with ``theta_i <= 2 pi / L`` are clipped.
            None: none clipped.
        num_inv_freq: instead of the floor, keep the first this many pairs.
        sigma: standard deviation of the random part of the initial coefficients.
        clipped_sin: the sine of the clipped pairs (their cosine is 1): 0, the paper's zero
            frequency (they pass unchanged), or 1 as the released code (see above).
        interleaved: pair layout, adjacent ``(2i, 2i+1)`` instead of half-split.

    Attributes:
        cos_coef, sin_coef: ``nn.Parameter [Hc, F, F]``, the coefficients ``C^cos``,
            ``C^sin`` (input frequency, output pair).

    Raises:
        ValueError: odd ``head_dim``, bad counts, negative ``sigma`` (see also
            ``fope_frequencies``).
    """

    sites = Site.QK

    def __init__(
        self,
        head_dim: int,
        *,
        coef_heads: int = 1,
        base: float = DEFAULT_BASE,
        max_len: int | None = None,
        num_inv_freq: int | None = None,
        sigma: float = DEFAULT_SIGMA,
        clipped_sin: float = 0.0,
        interleaved: bool = False,
    ) -> None:
        super().__init__()
        self.head_dim = check_even("head_dim", head_dim)
        self.coef_heads = check_int("coef_heads", coef_heads)
        self.sigma = check_float("sigma", sigma, minimum=0.0)
        self.clipped_sin = check_float("clipped_sin", clipped_sin)
        self.interleaved = check_bool("interleaved", interleaved)
        self.base = check_float("base", base, positive=True)
        inv_freq = fope_frequencies(head_dim, base=base, max_len=max_len, num_inv_freq=num_inv_freq)
        self.inv_freq = inv_freq  # float64 [F], a plain tensor: no .to(dtype) rounds it
        kept = inv_freq.numel()
        eye = torch.eye(kept).expand(self.coef_heads, kept, kept)
        self.cos_coef = nn.Parameter(eye + self.sigma * torch.randn(self.coef_heads, kept, kept))
        self.sin_coef = nn.Parameter(eye + self.sigma * torch.randn(self.coef_heads, kept, kept))

    def cos_sin(self, positions: Tensor, *, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """``(cos', sin')`` ``[Hc, T, P]`` or ``[B, Hc, T, P]`` at ``positions`` ``[T]`` /
        ``[B, T]``, in ``compute_dtype(dtype)`` (float64 for float64, else float32)."""
        work = compute_dtype(dtype)
        inv_freq = self.inv_freq.to(device=positions.device, dtype=work)
        angles = float_positions(positions, work).unsqueeze(-1) * inv_freq  # [(B,) T, F]
        cos = torch.einsum("...tf,hfp->...htp", angles.cos(), self.cos_coef.to(work))
        sin = torch.einsum("...tf,hfp->...htp", angles.sin(), self.sin_coef.to(work))
        clipped = self.head_dim // 2 - self.inv_freq.numel()
        return (
            nn.functional.pad(cos, (0, clipped), value=1.0),
            nn.functional.pad(sin, (0, clipped), value=self.clipped_sin),
        )

    def _transform(self, x: Tensor, positions: Tensor, name: str) -> Tensor:
        batch, heads, length = x.shape[0], x.shape[1], x.shape[-2]
        positions = check_positions(positions, name).to(x.device)
        if (
            positions.shape[-1:] != (length,)
            or positions.dim() > 2
            or (positions.dim() == 2 and positions.shape[0] not in (1, batch))
        ):
            raise ValueError(
                f"{name} must be [T] or [B, T] with T = {length}, B = {batch}, got shape "
                f"{tuple(positions.shape)}"
            )
        if heads % self.coef_heads:
            raise ValueError(
                f"FoPE has coefficients for {self.coef_heads} heads; {name[0]} has {heads} "
                "heads, which is not a multiple of it"
            )
        cos, sin = self.cos_sin(positions, dtype=x.dtype)  # [(B,) Hc, T, P]
        group, rows, pairs = heads // self.coef_heads, batch * heads, self.head_dim // 2
        cos, sin = (
            c.repeat_interleave(group, dim=-3).expand(batch, heads, length, pairs)
            for c in (cos, sin)
        )
        cos, sin = cos.reshape(rows, length, pairs), sin.reshape(rows, length, pairs)
        flat = x.reshape(rows, 1, length, self.head_dim)  # one "batch" row per head
        out = apply_rope(flat, cos, sin, interleaved=self.interleaved)
        return out.reshape(x.shape)

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        """Transform ``q [B, H, Tq, D]`` and ``k [B, Hkv, Tk, D]`` at their positions.

        Raises:
            ValueError: head_dim or batch mismatch; positions not ``[T]`` / ``[B, T]``;
                heads not a multiple of ``coef_heads``.
        """
        check_qk(q, k, self.head_dim)
        return self._transform(q, q_pos, "q_pos"), self._transform(k, k_pos, "k_pos")

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, coef_heads={self.coef_heads}, "
            f"kept_pairs={self.inv_freq.numel()}, sigma={self.sigma}, "
            f"interleaved={self.interleaved}"
        )
