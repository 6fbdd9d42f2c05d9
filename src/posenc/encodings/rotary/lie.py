"""Learned rotations from Lie algebras: LieRE and ComRoPE, rotary encodings of N-D positions.

* LieRE: Ostmeier et al. 2024, "LieRE: Generalizing Rotary Position Encodings" (arXiv
  2406.10322), sec. 3: ``R(p) = exp(sum_a p_a A_a)`` with learned skew-symmetric
  generators ``A_a``, one per position axis.
* ComRoPE: Yu et al. 2025, "ComRoPE: Scalable and Robust Rotary Position Embedding
  Parameterized by Trainable Commuting Angle Matrices" (CVPR 2025, arXiv 2506.03737),
  sec. 3-4: the same map with *commuting* generators, which is what makes the encoding
  relative (their Theorem 1); two parameterizations, AP and LD (below).

Shapes: ``B`` batch, ``H`` heads, ``N`` tokens, ``D`` head_dim, ``A`` position axes,
``b`` block size (divides ``D``), ``K = D / b`` blocks. Positions are ``[N, A]`` or
``[B, N, A]`` (integer or float coordinates; ``A = 1`` for text). Every generator is
block diagonal: block ``k`` of the features, ``x[..., k b:(k + 1) b]``, is rotated by
``exp(sum_a p_a A_{a,k})`` with ``A_{a,k}`` a ``b x b`` skew-symmetric matrix, so
``R(p)`` is orthogonal and ``R(0) = I``. Queries and keys are rotated alike,
``q' = R(p) q``, and the score is ``q^T R(p)^T R(p') k``.

* ``LieRE``: each ``A_{a,k}`` is a free skew-symmetric matrix (its strict upper triangle
  learned). The generators of different axes do not commute in general, so
  ``R(p)^T R(p') != R(p' - p)`` and the score is *not* a function of ``p' - p`` alone
  once ``A > 1`` (LieRE is relative only along one axis, or with commuting generators).
* ``ComRoPE(variant="ap")`` (axial partition): block ``k`` is split into ``A`` sub-blocks
  of ``b / A`` features and ``A_{a,k}`` is a free skew matrix on sub-block ``a`` only;
  generators with disjoint supports commute.
* ``ComRoPE(variant="ld")`` (linearly dependent): ``A_{a,k} = theta_{a,k} S_k``, one free
  skew matrix ``S_k`` per block scaled by a learned scalar per axis; multiples of one
  matrix commute. For both, ``R(p)^T R(p') = R(p' - p)``: the score depends on
  ``p' - p`` only.

RoPE is the special case ``b = 2``, ``A = 1``, ``A_{0,k} = [[0, -f_k], [f_k, 0]]`` with
RoPE's frequencies (interleaved pairs). That is the initialization here (``init="rope"``):
pair ``i`` of the head (features ``2i, 2i + 1``, inside its block) starts as axial RoPE,
axis ``i mod A`` at frequency ``base ** (-2 floor(i / A) / (D / A))`` (LieRE, ComRoPE-AP),
or, for LD, ``S_k`` as 1-D RoPE with ``theta ~ N(0, 1)``; ``init="normal"`` draws every
free entry from ``N(0, init_std^2)``. Generators are shared by the heads. The rotations
are computed with ``torch.linalg.matrix_exp`` in float64 (its error grows with the norm
of the angle matrix, i.e. with the positions, as RoPE's angles would in float32), then
applied in float32 at least; each call costs ``N K`` exponentials of ``b x b``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from posenc._checks import check_float, check_int, check_positions, float_positions
from posenc._dtypes import compute_dtype
from posenc.base import PositionalEncoding, Site, register
from posenc.encodings.rotary._shapes import check_qk

__all__ = ["ComRoPE", "LieRE", "lie_rotation"]

DEFAULT_BLOCK_SIZE = 8  # the default b is gcd(D, 8)
INITS = ("rope", "normal")
VARIANTS = ("ap", "ld")


def lie_rotation(generators: Tensor, positions: Tensor) -> Tensor:
    """``exp(sum_a p_a A_{a,k})``: ``[..., N, K, b, b]`` from ``generators [A, K, b, b]``
    (skew-symmetric) and ``positions [..., N, A]``, in the generators' dtype."""
    exact = float_positions(positions, generators.dtype)
    angles = torch.einsum("...a,akij->...kij", exact, generators)
    return torch.linalg.matrix_exp(angles)


def _skew(upper: Tensor) -> Tensor:
    """The skew-symmetric matrix whose strict upper triangle is that of ``upper [.., b, b]``."""
    strict = upper.triu(1)
    return strict - strict.transpose(-2, -1)


def _axis_frequencies(head_dim: int, axes: int, base: float) -> Tensor:
    """RoPE's frequencies of one axis of ``D / A`` features, ``[D / (2A)]`` float32:
    ``base ** (-2j / (D / A))``."""
    j = torch.arange(head_dim // (2 * axes), dtype=torch.float64)
    return (base ** (-2.0 * j / (head_dim / axes))).float()


class _LieRotary(PositionalEncoding):
    """Shared by LieRE and ComRoPE: shapes, positions and the rotation of ``q`` and ``k``;
    subclasses define ``generators() -> [A, K, b, b]``."""

    sites = Site.QK
    position_shape = "[N, A]"

    def __init__(self, head_dim: int, *, axes: int, block_size: int | None, init: str) -> None:
        super().__init__()
        self.head_dim = check_int("head_dim", head_dim)
        self.axes = check_int("axes", axes)
        if block_size is None:
            block_size = math.gcd(self.head_dim, DEFAULT_BLOCK_SIZE)
        self.block_size = check_int("block_size", block_size, minimum=2)
        if self.head_dim % self.block_size or self.block_size % 2:
            raise ValueError(
                f"block_size must be even and divide head_dim={head_dim}, got {block_size}"
            )
        if init not in INITS:
            raise ValueError(f"unknown init {init!r}; known: {', '.join(INITS)}")
        self.init = init
        self.num_blocks = self.head_dim // self.block_size

    def generators(self) -> Tensor:
        """The skew-symmetric generators ``[A, K, b, b]``."""
        raise NotImplementedError

    def rotation(self, positions: Tensor, *, dtype: torch.dtype = torch.float32) -> Tensor:
        """``R(p)`` per token and block, ``[..., N, K, b, b]``, for ``positions [..., N, A]``:
        the exponential in float64 (like RoPE's angles), returned in ``compute_dtype(dtype)``.

        Raises:
            ValueError: positions whose last dimension is not ``A``.
        """
        check_positions(positions, "positions")
        if positions.dim() < 2 or positions.shape[-1] != self.axes:
            raise ValueError(
                f"positions must be [..., N, {self.axes}], got shape {tuple(positions.shape)}"
            )
        rotation = lie_rotation(self.generators().to(torch.float64), positions)
        return rotation.to(compute_dtype(dtype))

    def attention_positions(
        self, positions: Tensor, *, batch: int, length: int
    ) -> tuple[Tensor | None, Tensor | None]:
        """``(None, positions)``: tokens are ordered (masked, cached) by their index and
        rotate at their ``[N, A]`` / ``[B, N, A]`` coordinates."""
        return None, self._check_grid(positions, length, batch, "positions")

    def _check_grid(self, positions: Tensor, tokens: int, batch: int, name: str) -> Tensor:
        check_positions(positions, name)
        shape = tuple(positions.shape)
        ok = positions.dim() in (2, 3) and shape[-2:] == (tokens, self.axes)
        if not ok or (positions.dim() == 3 and shape[0] not in (1, batch)):
            raise ValueError(
                f"{type(self).__name__} {name} must be [N, {self.axes}] or [B, N, "
                f"{self.axes}] with N = {tokens}, B = {batch}; got shape {shape}"
            )
        return positions

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        """``R(p) q`` and ``R(p) k`` for ``q [B, H, Tq, D]``, ``k [B, Hkv, Tk, D]`` at
        ``q_pos [Tq, A] | [B, Tq, A]`` and ``k_pos [Tk, A] | [B, Tk, A]``.

        Raises:
            ValueError: head_dim or batch mismatch; positions of another shape.
        """
        batch, out = check_qk(q, k, self.head_dim), []
        rotations = {}
        for x, pos, name in ((q, q_pos, "q_pos"), (k, k_pos, "k_pos")):
            pos = self._check_grid(pos, x.shape[-2], batch, name).to(x.device)
            if id(pos) not in rotations:  # q and k at the same positions: one exponential
                rotations[id(pos)] = self.rotation(pos, dtype=x.dtype)
            rot = rotations[id(pos)]  # [B|., N, K, b, b]
            rot = rot.unsqueeze(-5) if rot.dim() == 5 else rot  # [B, 1, N, K, b, b]
            blocks = x.unflatten(-1, (self.num_blocks, self.block_size))  # [B, H, N, K, b]
            turned = torch.einsum("...kij,...kj->...ki", rot, blocks.to(rot.dtype))
            out.append(turned.flatten(-2).to(x.dtype))
        return out[0], out[1]

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, axes={self.axes}, block_size={self.block_size}, "
            f"init={self.init!r}"
        )


def _init_upper(shape: tuple[int, ...], init: str, init_std: float) -> Tensor:
    return torch.randn(shape) * init_std if init == "normal" else torch.zeros(shape)


@register(
    "liere",
    paper="Ostmeier et al. 2024, LieRE: Generalizing Rotary Position Encodings",
    description="learned skew-symmetric generators per axis, R(p) = exp(sum_a p_a A_a) on "
    "blocks of the head [N, A]",
)
class LieRE(_LieRotary):
    """LieRE: free learned skew-symmetric generators, one per axis and block.

    Args:
        head_dim: ``D``.
        axes: ``A``, coordinates per position (2 for image patches, 1 for text).
        block_size: ``b``, even, divides ``D`` (``D``: one dense rotation of the head);
            None: ``gcd(D, 8)``.
        init: ``"rope"`` (axial RoPE at first) or ``"normal"`` (see the module docstring).
        base: RoPE's base for ``init="rope"``.
        init_std: standard deviation of the free entries for ``init="normal"``.

    Attributes:
        weight: ``[A, K, b, b]``, whose strict upper triangles are the generators'.

    Not relative for ``A > 1`` in general (the generators need not commute).

    Raises:
        ValueError: ``block_size`` odd or not dividing ``head_dim``; an unknown ``init``.
    """

    def __init__(
        self,
        head_dim: int,
        *,
        axes: int = 2,
        block_size: int | None = None,
        init: str = "rope",
        base: float = 10000.0,
        init_std: float = 0.1,
    ) -> None:
        super().__init__(head_dim, axes=axes, block_size=block_size, init=init)
        shape = (self.axes, self.num_blocks, self.block_size, self.block_size)
        weight = _init_upper(shape, init, check_float("init_std", init_std, positive=True))
        if init == "rope":
            base = check_float("base", base, positive=True)
            freq = _axis_frequencies(
                self.head_dim - self.head_dim % (2 * self.axes), self.axes, base
            )
            pair = torch.arange(freq.numel() * self.axes)  # pair i: axis i mod A, f[i // A]
            block, row = pair // (self.block_size // 2), 2 * (pair % (self.block_size // 2))
            weight[pair % self.axes, block, row, row + 1] = -freq[pair // self.axes]
        self.weight = nn.Parameter(weight)

    def generators(self) -> Tensor:
        return _skew(self.weight)


@register(
    "comrope",
    paper="Yu et al. 2025, ComRoPE: Scalable and Robust Rotary Position Embedding "
    "Parameterized by Trainable Commuting Angle Matrices (CVPR)",
    description="learned commuting skew-symmetric generators (axial partition or linearly "
    "dependent): relative N-D rotations [N, A]",
)
class ComRoPE(_LieRotary):
    """ComRoPE: learned commuting generators, so the score depends on ``p' - p`` only.

    Args:
        head_dim: ``D``.
        axes: ``A``.
        block_size: ``b``, even, divides ``D``; for ``"ap"`` a multiple of ``2 A``. None:
            ``gcd(D, 8)``.
        variant: ``"ap"`` (axial partition) or ``"ld"`` (linearly dependent).
        init: ``"rope"`` or ``"normal"`` (see the module docstring).
        base: RoPE's base for ``init="rope"``.
        init_std: standard deviation of the free entries for ``init="normal"``.

    Attributes:
        weight: ``"ap"``: ``[A, K, b/A, b/A]``, the sub-blocks' strict upper triangles;
            ``"ld"``: ``[K, b, b]``, those of ``S_k``.
        theta: ``"ld"`` only: ``[A, K]``, the scale of ``S_k`` per axis.

    Raises:
        ValueError: an unknown ``variant`` or ``init``; ``block_size`` odd, not dividing
            ``head_dim``, or (``"ap"``) not a multiple of ``2 A``.
    """

    def __init__(
        self,
        head_dim: int,
        *,
        axes: int = 2,
        block_size: int | None = None,
        variant: str = "ap",
        init: str = "rope",
        base: float = 10000.0,
        init_std: float = 0.1,
    ) -> None:
        super().__init__(head_dim, axes=axes, block_size=block_size, init=init)
        if variant not in VARIANTS:
            raise ValueError(f"unknown variant {variant!r}; known: {', '.join(VARIANTS)}")
        self.variant = variant
        init_std = check_float("init_std", init_std, positive=True)
        base = check_float("base", base, positive=True)
        blocks, size = self.num_blocks, self.block_size
        if variant == "ap":
            if size % (2 * self.axes):
                raise ValueError(
                    f"variant 'ap' needs block_size divisible by 2 * axes = {2 * self.axes}, "
                    f"got {size}"
                )
            size //= self.axes
            weight = _init_upper((self.axes, blocks, size, size), init, init_std)
        else:
            weight = _init_upper((blocks, size, size), init, init_std)
            self.theta = nn.Parameter(
                torch.randn(self.axes, blocks) * (1.0 if init == "rope" else init_std)
            )
        if init == "rope":  # pairs of each (sub-)block at axial (AP) or 1-D (LD) frequencies
            axes = self.axes if variant == "ap" else 1
            freq = _axis_frequencies(self.head_dim, axes, base).view(blocks, size // 2)
            row = torch.arange(0, size, 2)
            weight.view(-1, blocks, size, size)[:, :, row, row + 1] = -freq
        self.weight = nn.Parameter(weight)

    def generators(self) -> Tensor:
        skew = _skew(self.weight)
        if self.variant == "ld":
            return self.theta[..., None, None] * skew  # [A, K, b, b]
        return _axial_blocks(skew)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, variant={self.variant!r}"


def _axial_blocks(skew: Tensor) -> Tensor:
    """``[A, K, s, s]`` sub-block generators as ``[A, K, A s, A s]``: axis ``a``'s on the
    ``a``-th diagonal sub-block, zeros elsewhere."""
    axes, blocks, size, _ = skew.shape
    out = skew.new_zeros(axes, blocks, axes, size, axes, size)
    index = torch.arange(axes)
    out[index, :, index, :, index, :] = skew
    return out.reshape(axes, blocks, axes * size, axes * size)
