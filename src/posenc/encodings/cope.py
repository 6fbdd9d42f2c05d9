"""CoPE: contextual position encoding (Golovneva, Wang, Weston and Sukhbaatar 2024,
"Contextual Position Encoding: Learning to Count What's Important", eqs. (3)-(6)).

Shapes: ``B`` batch, ``H`` heads, ``Tq`` queries, ``Tk`` keys, ``D`` head_dim, ``P``
npos_max. Positions are counted by the content: for a query ``i`` and each key ``j`` it
can see (``k_pos[j] <= q_pos[i]``)

    g_ij = sigmoid(q_i . k_j / sqrt(D))                     gates
    p_ij = min(sum_{t = j..i} g_it, P - 1)                  contextual position
    e[p] = (1 - w) e[floor p] + w e[ceil p],  w = p - floor p
    b_ij = q_i . e[p_ij] / sqrt(D)                          the logits bias

with a learned table ``e [P, D]`` shared by the heads (zeros at start, as in the paper's
code). Every query product carries the attention module's ``1 / sqrt(D)``, so the logits
are ``q_i . (k_j + e[p_ij]) / sqrt(D)``, the paper's eq. (6) under standard scaling (its
code leaves ``q . e`` unscaled, which is the same model with ``e`` scaled by
``sqrt(D)``). ``q . e`` is computed for the ``P`` integer positions only
(``[B, H, Tq, P]``) and gathered at ``floor p`` and ``ceil p``.

The causal set is defined by positions (``k_pos <= q_pos``), so a block of queries and
one-token decoding against a KV cache give the rows of the full bias; the sum runs over
the key axis in storage order, which must be non-decreasing in position (as in a cache).
Gates and positions are computed in float32 (float64 for float64 inputs). CoPE is only
defined under a causal mask (``causal_only``).

Negative positions: allowed; positions only decide which keys are visible
(``k_pos <= q_pos``).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from posenc._checks import check_bool, check_int, check_tensor
from posenc._compiling import static_compiled
from posenc._dtypes import compute_dtype
from posenc.base import PositionalEncoding, Site, register
from posenc.encodings._relative import check_hook_inputs

__all__ = ["CoPE", "cope_band_bias", "cope_bias", "cope_positions"]


def cope_positions(q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, npos_max: int) -> Tensor:
    """Contextual positions ``p_ij``, ``[B, H, Tq, Tk]`` in float32 (float64 for float64).

    Args:
        q: ``[B, H, Tq, D]`` queries.
        k: ``[B, H, Tk, D]`` keys, in non-decreasing position order.
        q_pos: ``[Tq]`` or ``[B, Tq]`` positions.
        k_pos: ``[Tk]`` or ``[B, Tk]`` positions.
        npos_max: ``P``; positions are clipped to ``P - 1``.

    Returns:
        ``p_ij = min(sum over visible keys t at or after j of g_it, P - 1)``; 0 for keys
        the query cannot see.

    Raises:
        ValueError: wrong ranks or shapes, ``npos_max < 1``.
    """
    npos_max = check_int("npos_max", npos_max)
    q_pos, k_pos = check_hook_inputs(q, k, q_pos, k_pos, same_dtype=True)
    work = compute_dtype(q.dtype)
    logits = torch.matmul(q, k.transpose(-2, -1)).to(work) * q.shape[-1] ** -0.5
    visible = (q_pos.unsqueeze(-1) >= k_pos.unsqueeze(-2)).unsqueeze(-3)  # [B|1, 1, Tq, Tk]
    gates = torch.sigmoid(logits) * visible  # [B, H, Tq, Tk]
    return gates.flip(-1).cumsum(-1).flip(-1).clamp(max=npos_max - 1)


def cope_bias(q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, pos_emb: Tensor) -> Tensor:
    """The CoPE logits bias ``q_i . e[p_ij] / sqrt(D)``.

    Args:
        q: ``[B, H, Tq, D]`` queries.
        k: ``[B, H, Tk, D]`` keys, in non-decreasing position order.
        q_pos: ``[Tq]`` or ``[B, Tq]`` positions.
        k_pos: ``[Tk]`` or ``[B, Tk]`` positions.
        pos_emb: ``e [P, D]``.

    Returns:
        ``[B, H, Tq, Tk]`` in ``q``'s dtype.

    Raises:
        ValueError: wrong ranks or shapes, or ``pos_emb`` not ``[P, D]``.
    """
    check_tensor("pos_emb", pos_emb, ndim=2)
    check_tensor("q", q, ndim=4)
    if pos_emb.shape[1] != q.shape[-1]:
        raise ValueError(
            f"pos_emb must be [npos_max, head_dim={q.shape[-1]}], got {tuple(pos_emb.shape)}"
        )
    p = cope_positions(q, k, q_pos, k_pos, pos_emb.shape[0])
    work = p.dtype
    per_position = torch.matmul(q, pos_emb.to(q.dtype).T).to(work) * q.shape[-1] ** -0.5
    return _interpolate(per_position, p).to(q.dtype)  # [B, H, Tq, Tk]


def _interpolate(per_position: Tensor, p: Tensor) -> Tensor:
    """``e``-products at fractional positions: ``per_position [..., P]`` read at ``p``."""
    # NaN gates (NaN in q or k) index 0 and w carries the NaN; ``p`` is never infinite
    # (clamped above, a sum of gates below); a comparison, unlike nan_to_num, leaves the
    # compiled gathers vectorized
    index = torch.where(p >= 0, p, 0.0)
    low = index.floor()
    w = p - low  # gradient reaches the gates through the interpolation weight
    at_low = per_position.gather(-1, low.long())
    at_high = per_position.gather(-1, index.ceil().long())
    return at_low + w * (at_high - at_low)


def cope_band_bias(
    q: Tensor, k: Tensor, pos_emb: Tensor, *, max_width: int, compiled: bool = False
) -> Tensor | None:
    """CoPE's bias near the diagonal, for queries and keys at positions ``0..T-1``.

    Once the gates summed from the diagonal reach ``P - 1``, every farther key sits at
    position ``P - 1`` and gets the same bias ``c_i = q_i . e[P - 1] / sqrt(D)``; the
    softmax ignores a per-row constant, so ``b_ij - c_i`` is zero beyond a band of
    offsets ``i - j < W``. ``W`` is the smallest power of two (at least ``4P``, capped at
    ``T``) past which every row's bias is ``c_i``.

    Args:
        q, k: ``[B, H, T, D]`` at positions ``0..T-1`` (causal).
        pos_emb: ``e [P, D]``.
        max_width: the widest band returned.
        compiled: compute each width with ``torch.compile`` (three fused loops around
            one batched matmul and the cumulative sum, instead of about 25 operations),
            once per length and width; not inside an outer ``torch.compile``.

    Returns:
        ``band [B, H, T, W]`` in ``q``'s dtype, ``band[..., i, d] = b_(i, i-d) - c_i``
        (``d > i``: unused), or None when the band is wider than ``max_width``.
    """
    length, npos = q.shape[-2], pos_emb.shape[0]
    step = _compiled_band_step if compiled else _band_step
    width = 1 << max(4 * npos - 1, 1).bit_length()  # gates near 1/2 need ~2P keys
    while True:
        width = min(width, length)
        if width > max_width:
            return None
        band, reached = step(q, k, pos_emb.to(q.dtype), width)
        if width == length or bool(reached):
            return band
        width *= 2


#: Queries per block of the band step: each block multiplies ``W + BAND_ROWS - 1`` keys,
#: of which ``W`` per query are in the band.
BAND_ROWS = 64


def _band_step(q: Tensor, k: Tensor, pos_emb: Tensor, width: int) -> tuple[Tensor, Tensor]:
    """``cope_band_bias`` at one ``width``: the band ``[B, H, T, W]`` and whether every row
    from ``W`` on sums its gates to ``P - 1`` within it (a bool tensor).

    One batched product over blocks of ``Tb = min(W, BAND_ROWS)`` queries gives the band's
    dot products: each block against the ``W + Tb - 1`` keys it reaches (an overlapping
    strided view of the keys, left-padded with ``W - 1`` zero rows, keys before position
    0, masked), read in place. The keys are taken in reverse order, and the blocks too
    (block ``n`` meets window ``n_blocks - 1 - n``), so that the band
    ``[i, d] -> q_i . k_(i-d)`` is a view with positive strides, which the compiled loops
    read in vectors. Its scores, ``[B, H, T, W + Tb - 1]``, are the peak memory: under
    twice the band's. ``q . e`` is a second, ``[B, H, T, P]`` product.
    """
    batch, heads, length, dim = q.shape
    npos = pos_emb.shape[0]
    work = compute_dtype(q.dtype)
    rows = min(width, BAND_ROWS)  # queries per block
    blocks = (length + rows - 1) // rows
    tail = blocks * rows - length
    reach = width + rows - 1
    q = q * dim**-0.5
    q_blocks = nn.functional.pad(q, (0, 0, 0, tail))
    q_blocks = q_blocks.view(batch, heads, blocks, rows, dim).flip(2)  # last block first
    keys = nn.functional.pad(k, (0, 0, width - 1, tail)).flip(-2)  # [B, H, n rows + W - 1, D]
    windows = keys.as_strided(  # m: keys of block n - 1 - m, from its last one down
        (batch, heads, blocks, reach, dim), (*keys.stride()[:2], rows * dim, dim, 1)
    )
    scores = torch.matmul(q_blocks, windows.transpose(-2, -1))  # [B, H, n, rows, R], last first
    # row r of a block, column rows - 1 - r + d holds q_i . k_(i-d)
    dots = scores.as_strided(
        (batch, heads, blocks, rows, width), (*scores.stride()[:3], reach - 1, 1), rows - 1
    ).flip(2)
    dots = dots.reshape(batch, heads, blocks * rows, width)[:, :, :length].to(work)
    per_position = torch.matmul(q, pos_emb.T).to(work)  # [B, H, T, P]
    offsets = torch.arange(width, device=q.device)
    ahead = offsets > torch.arange(length, device=q.device)[:, None]  # key before 0
    sums = torch.sigmoid(dots).masked_fill(ahead, 0.0).cumsum(-1)  # [B, H, T, W]
    reached = (sums[..., width:, -1] >= npos - 1).all()
    bias = _interpolate(per_position, sums.clamp(max=npos - 1)) - per_position[..., -1:]
    return bias.to(q.dtype), reached


#: ``_band_step`` compiled for each shape. Static shapes: a band step compiled with dynamic
#: ones makes the FlexAttention kernel compiled after it fail to build (a C++ compile
#: error in torch 2.13).
_compiled_band_step = static_compiled(lambda: _band_step, fullgraph=True)


@register(
    "cope",
    paper="Golovneva et al. 2024, Contextual Position Encoding (CoPE)",
    description="positions counted by sigmoid gates of q.k; interpolated learned embeddings",
)
class CoPE(PositionalEncoding):
    """CoPE as a SCORE-site encoding (causal attention only).

    Args:
        head_dim: ``D``.
        npos_max: ``P``, the number of position embeddings (contextual positions are
            clipped to ``P - 1``).
        causal: must be True.

    Raises:
        ValueError: ``head_dim`` or ``npos_max`` < 1, or ``causal=False``.
    """

    sites = Site.SCORE
    causal_only = True

    def __init__(self, head_dim: int, *, npos_max: int = 64, causal: bool = True) -> None:
        super().__init__()
        if not check_bool("causal", causal):
            raise ValueError("CoPE is only defined for causal attention, got causal=False")
        self.head_dim = check_int("head_dim", head_dim)
        self.npos_max = check_int("npos_max", npos_max)
        self.pos_emb = nn.Parameter(torch.zeros(self.npos_max, self.head_dim))

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """``[B, H, Tq, Tk]`` bias in ``q``'s dtype."""
        return cope_bias(q, k, q_pos, k_pos, self.pos_emb)

    def band_bias(
        self, q: Tensor, k: Tensor, *, max_width: int, compiled: bool = False
    ) -> Tensor | None:
        """``cope_band_bias`` with this table (the ``flex`` attention backend's form)."""
        return cope_band_bias(q, k, self.pos_emb.detach(), max_width=max_width, compiled=compiled)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, npos_max={self.npos_max}"
