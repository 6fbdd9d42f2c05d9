"""Shared by the hardening tests: small registered encodings and a driver of their hooks.

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head_dim, ``C`` d_model.
"""

from __future__ import annotations

import torch
from torch import Tensor

import posenc
from posenc import PositionalEncoding, Site

B, H, D = 2, 4, 8
C = H * D

#: One RoPE scaling of every type, for a short original length (8) so that tests reach
#: beyond it.
SCALINGS = {
    "default": posenc.DefaultRope(),
    "linear": posenc.LinearScaling(2.0),
    "ntk": posenc.NTKScaling(2.0),
    "dynamic": posenc.DynamicNTKScaling(2.0, 8),
    "yarn": posenc.YarnScaling(4.0, 8),
    "llama3": posenc.Llama3Scaling(8.0, 1.0, 4.0, 8),
    "longrope": posenc.LongRopeScaling((1.0, 1.5, 2.0, 3.0), (2.0, 3.0, 4.0, 6.0), 8, 4.0),
}


#: Constructor keywords beyond the model shape, so that every encoding acts within the
#: tests' few positions: the query temperature steps every 4 positions, not 8192.
SHORT = {"temperature": {"length": 4}, "dual_chunk": {"chunk_size": 6, "local_size": 2}}


def build_encoding(name: str, *, seed: int = 0, max_len: int = 16) -> PositionalEncoding:
    """``posenc.build(name)`` for the shapes above, learned parameters moved off their init.

    CoPE's table starts at zero, which would hide its content dependence; every parameter
    gets a small seeded perturbation so that each encoding's output depends on all of them.
    """
    torch.manual_seed(seed)
    shape = {"d_model": C, "num_heads": H, "head_dim": D, "max_len": max_len, "causal": True}
    enc = posenc.build(name, **shape, **SHORT.get(name, {}))
    with torch.no_grad():
        for p in enc.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return enc


def make_inputs(length: int, *, seed: int = 1, dtype: torch.dtype = torch.float32):
    """Seeded ``x [B, T, C]``, ``q [B, H, T, D]``, ``k [B, H, T, D]`` and ``arange(T)``."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, length, C, generator=g).to(dtype)
    q = torch.randn(B, H, length, D, generator=g).to(dtype)
    k = torch.randn(B, H, length, D, generator=g).to(dtype)
    return x, q, k, torch.arange(length)


def positions_for(enc: PositionalEncoding, index: Tensor) -> Tensor:
    """The positions of ``enc.position_shape`` for the tokens at ``index [T] | [B, T]``.

    Elementwise in the index, so slicing the tokens slices the positions: ``[T]`` the index
    ``i`` itself; ``[A, T]`` (M-RoPE's time, height, width) ``(i, i // 2, i % 4)``
    stacked first; ``[N, A]`` the patch ``(i // 4, i % 4)`` of a grid 4 wide, stacked last;
    other counts of axes repeat ``i // 2`` in the middle. A shift of the indices by a
    multiple of 4 shifts each axis by a constant.

    Raises:
        ValueError: a ``position_shape`` without example positions here.
    """
    shape = enc.position_shape
    if shape == "[T]":
        return index
    if shape == "[A, T]":
        return torch.stack((index, *[index // 2] * (enc.num_axes - 2), index % 4))
    if shape == "[N, A]":
        return torch.stack((index // 4, *[index // 2] * (enc.axes - 2), index % 4), dim=-1)
    raise ValueError(f"no example positions for position_shape {shape!r}")


def attention_positions(enc: PositionalEncoding, index: Tensor | None, length: int):
    """What to give ``MultiHeadAttention`` for the tokens at ``index`` (None: ``0..T-1``):
    ``index`` itself for token positions, else ``positions_for`` (structured positions
    have no default)."""
    if enc.position_shape == "[T]":
        return index
    return positions_for(enc, torch.arange(length) if index is None else index)


def apply_hooks(
    enc: PositionalEncoding, x: Tensor, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor
) -> dict[str, Tensor]:
    """Every hook of ``enc``'s sites on ``x [B, Tq, C]``, ``q [B, H, Tq, D]``, ``k [B, H, Tk, D]``.

    ``q_pos`` and ``k_pos`` are token indices; ``rotate`` gets ``positions_for`` them.

    Returns:
        ``{"embed": ...}`` (INPUT, on ``x`` at ``q_pos``), ``{"q": ..., "k": ...}`` (QK),
        ``{"bias": ...}`` (SCORE), ``{"value": ...}`` (VALUE, on the causal softmax of
        ``q k^T``, so that a prefix of the queries and keys gives a prefix of the rows),
        ``{"weights": ...}`` (WEIGHTS, with the gates of ``x``, whose tokens are the keys').
    """
    out: dict[str, Tensor] = {}
    if enc.sites & Site.INPUT:
        out["embed"] = enc.embed(x, q_pos)
    if enc.sites & Site.QK:
        out["q"], out["k"] = enc.rotate(q, k, positions_for(enc, q_pos), positions_for(enc, k_pos))
    if enc.sites & Site.SCORE:
        out["bias"] = enc.score_bias(q, k, q_pos, k_pos)
    if enc.sites & Site.VALUE:
        hidden = k_pos[..., None, :] > q_pos[..., :, None]  # [Tq, Tk] | [B, Tq, Tk]
        scores = (q @ k.transpose(-2, -1)).masked_fill(hidden.unsqueeze(-3), -torch.inf)
        probs = torch.softmax(scores, dim=-1)  # [B, H, Tq, Tk]
        out["value"] = enc.value_term(probs, q_pos, k_pos)
    if enc.sites & Site.WEIGHTS:
        gates = enc.gates(x)  # [B, H|1, Tk, G]
        q_gates = gates[..., gates.shape[-2] - q.shape[-2] :, :]
        out["weights"] = enc.weights(q, k, q_pos, k_pos, q_gates, gates)
    return out
