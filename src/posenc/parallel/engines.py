"""Per-rank RoPE tables in the forms the training engines consume under context parallelism.

Shapes: ``T`` global length, ``S`` a rank's shard length, ``R`` rotary_dim, ``L`` rows of a
lookup table (``max_len``). RoPE (Su et al. 2021, "RoFormer", sec. 3.2, eq. 34) rotates pair
``i`` of a token at position ``m`` by ``m * inv_freq[i]``; every scaling posenc has enters
through the ``RotaryEmbedding``'s own frequencies.

* torchtitan keeps one table for all positions and each rank looks it up with the positions
  it holds (sharded with the inputs, torchtitan#792): ``torchtitan_freqs_cis`` is the complex
  ``[L, R/2]`` table of its ``ComplexRoPE`` (adjacent pairs), ``torchtitan_cos_sin`` the
  ``[L, 2R]`` cos-then-sin table of its ``CosSinRoPE`` (half-split pairs).
* Megatron-Core and TransformerEngine take the rank's own angles as ``[S, 1, 1, R]``, the
  ``R/2`` angles written twice (halves concatenated, or each repeated for interleaved pairs)
  as Megatron's ``RotaryEmbedding.forward`` returns them, and the attention scale (its
  ``mscale``) apart: ``megatron_rope_freqs``.

The tables carry posenc's frequencies exactly: angles formed in float64 and rounded once to
float32; the attention scale (YaRN, LongRoPE) is the magnitude of the complex table and
multiplies the cos/sin table, as posenc and transformers apply it (torchtitan's own YaRN
keeps a unit magnitude and folds the scale into the softmax scale instead). A
length-dependent scaling (dynamic NTK, LongRoPE) is told the unsplit length through
``RotaryEmbedding.observe_length``, so every rank rotates with the frequencies of the whole
sequence, never of its shard.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posenc._checks import check_int, float_positions
from posenc.encodings.rotary.module import RotaryEmbedding
from posenc.parallel.layouts import ShardLayout

__all__ = ["megatron_rope_freqs", "torchtitan_cos_sin", "torchtitan_freqs_cis"]


def _frequencies(rope: object, length: int) -> tuple[Tensor, float]:
    """``(signed inv_freq [R/2] float64, attention_scale)`` of ``rope`` at ``length``."""
    if not isinstance(rope, RotaryEmbedding):
        raise TypeError(f"rope must be a posenc.RotaryEmbedding, got {type(rope).__name__}")
    if type(rope)._modulate is not RotaryEmbedding._modulate:
        raise ValueError(
            f"{type(rope).__name__} scales queries and keys differently at each position; "
            "a table of angles cannot carry that (rotate with the module itself)"
        )
    rope.observe_length(check_int("length", length, minimum=0))
    sign = -1.0 if rope.clockwise else 1.0
    return sign * rope.inv_freq, rope.attention_scale


def _angles(positions: Tensor, inv_freq: Tensor) -> Tensor:
    """``positions[:, None] * inv_freq`` in float64, rounded once to float32: ``[N, R/2]``."""
    return (float_positions(positions, torch.float64)[:, None] * inv_freq).to(torch.float32)


def torchtitan_freqs_cis(
    rope: RotaryEmbedding, max_len: int, *, length: int | None = None
) -> Tensor:
    """torchtitan's ``freqs_cis`` table: ``[max_len, R/2]`` complex64, ``scale * exp(i angle)``.

    Every rank holds the same table and indexes it with the positions it holds
    (``freqs_cis[layout.positions]``, or torchtitan's ``ComplexRoPE`` with ``positions``).

    Args:
        rope: the encoding; its scaling, base and rotary_dim define the table.
        max_len: rows ``L``, positions ``0 .. L-1``.
        length: the unsplit length a length-dependent scaling follows (default ``max_len``).

    Raises:
        TypeError: if ``rope`` is not a ``RotaryEmbedding``.
        ValueError: for xPos (not a pure rotation) or a bad length.
    """
    max_len = check_int("max_len", max_len)
    inv_freq, scale = _frequencies(rope, max_len if length is None else length)
    angles = _angles(torch.arange(max_len), inv_freq)
    return torch.polar(torch.full_like(angles, scale), angles)


def torchtitan_cos_sin(rope: RotaryEmbedding, max_len: int, *, length: int | None = None) -> Tensor:
    """torchtitan's ``CosSinRoPE`` cache: ``[max_len, 2R]``, ``cos`` then ``sin`` of the angles
    with halves concatenated, times the attention scale. Arguments as ``torchtitan_freqs_cis``.
    """
    max_len = check_int("max_len", max_len)
    inv_freq, scale = _frequencies(rope, max_len if length is None else length)
    angles = _angles(torch.arange(max_len), inv_freq).repeat(1, 2)
    return torch.cat([angles.cos(), angles.sin()], dim=-1) * scale


def megatron_rope_freqs(
    rope: RotaryEmbedding, layout: ShardLayout, *, length: int | None = None
) -> tuple[Tensor, float]:
    """The rank's RoPE angles as Megatron-Core / TransformerEngine consume them.

    For a contiguous or head-tail layout this is what Megatron's ``RotaryEmbedding.forward``
    returns on that rank (``get_pos_emb_on_this_cp_rank``); for a THD layout it is the packed
    ``freqs`` ``_apply_rotary_pos_emb_thd`` builds from ``_get_thd_freqs_on_this_cp_rank``,
    positions restarting in every document.

    Args:
        rope: the encoding; ``rope.interleaved`` picks Megatron's ``rotary_interleaved`` form.
        layout: the rank's layout; its ``positions`` are rotated.
        length: the length a length-dependent scaling follows (default
            ``layout.unsplit_length``: ``T``, or the longest document for THD).

    Returns:
        ``(freqs [S, 1, 1, R] float32, attention_scale)``: pass the scale as Megatron's
        ``mscale`` (``cos(freqs) * mscale``).

    Raises:
        TypeError: if ``rope`` is not a ``RotaryEmbedding`` or ``layout`` not a ``ShardLayout``.
        ValueError: for xPos (not a pure rotation) or a bad length.
    """
    if not isinstance(layout, ShardLayout):
        raise TypeError(f"layout must be a ShardLayout, got {type(layout).__name__}")
    inv_freq, scale = _frequencies(rope, layout.unsplit_length if length is None else length)
    angles = _angles(layout.positions, inv_freq)
    if rope.interleaved:
        doubled = angles.repeat_interleave(2, dim=-1)  # pair i -> features 2i, 2i + 1
    else:
        doubled = torch.cat([angles, angles], dim=-1)  # pair i -> features i, i + R/2
    return doubled[:, None, None, :], scale
