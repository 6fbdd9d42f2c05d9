"""posenc.diffusers against diffusers' own position code, model class by model class.

Each case builds diffusers' position module from a tiny config (``tests/_diffusers_cases``)
and posenc's from the same config with ``posenc.from_diffusers``, at the positions
``diffusers_positions`` builds for the same grid, and compares

* RoPE: the cos/sin of every pair (posenc in float64) and queries rotated by diffusers'
  ``apply_rotary_emb`` (or the model's own rotation) and by posenc's ``rotate`` (float32);
* sin-cos tables: the whole table (posenc in float64).

diffusers rounds its angles (and, where it computes them so, its frequencies) to float32,
so the tolerance is ``c * eps32 * (1 + max |angle|)``: the float32 rounding of an angle of
that size, a few times over.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("diffusers")

from diffusers.models.embeddings import apply_rotary_emb
from diffusers.models.transformers.transformer_hidream_image import apply_rope as hidream_apply_rope

from _diffusers_cases import NOPE_CLASSES, ROPE_CASES, TABLE_CASES
from posenc import MRoPE, NoPE
from posenc.diffusers import GridSinCos, diffusers_positions, from_diffusers

EPS32 = torch.finfo(torch.float32).eps


def _config(case):
    return {"_class_name": case.class_name, **case.config}


def _tolerance(scale: float) -> float:
    return 16 * EPS32 * (1.0 + scale)


def _own_rotation(reference):
    """``(reference, fn)``: a model's own rotation, when its reference carries one last."""
    if len(reference) > 2 and callable(reference[-1]):
        return reference[:-1], reference[-1]
    return reference, None


def _pairs(reference):
    """diffusers' tables as ``(cos, sin)`` ``[N, P]`` float64, one value per pair."""
    kind, *tables = reference
    if kind == "pairs":
        return tables[0].double(), tables[1].double()
    if kind == "complex":
        (freqs,) = tables
        return freqs.real.double(), freqs.imag.double()
    if kind == "matrix":  # [[cos, -sin], [sin, cos]] per pair
        (matrix,) = tables
        torch.testing.assert_close(matrix[..., 0, 1], -matrix[..., 1, 0], rtol=0, atol=0)
        return matrix[..., 0, 0].double(), matrix[..., 1, 0].double()
    cos, sin = tables
    if kind == "real_half":  # [c | c]: the half-split layout
        half = cos.shape[-1] // 2
        torch.testing.assert_close(cos[:, :half], cos[:, half:], rtol=0, atol=0)
        torch.testing.assert_close(sin[:, :half], sin[:, half:], rtol=0, atol=0)
        return cos[:, :half].double(), sin[:, :half].double()
    # repeat_interleave tables: both members of a pair carry the same value
    torch.testing.assert_close(cos[:, 0::2], cos[:, 1::2], rtol=0, atol=0)
    torch.testing.assert_close(sin[:, 0::2], sin[:, 1::2], rtol=0, atol=0)
    return cos[:, 0::2].double(), sin[:, 0::2].double()


def _diffusers_rotate(x, reference):
    """Rotate ``x [B, H, N, D]`` as the model does with its tables."""
    kind, *tables = reference
    if kind == "rotate":
        return tables[0](x)
    if kind == "complex":
        out = apply_rotary_emb(x.transpose(1, 2), tables[0][None], use_real=False)
        return out.transpose(1, 2)
    if kind == "matrix":
        out, _ = hidream_apply_rope(x.transpose(1, 2), x.transpose(1, 2), tables[0][None, :, None])
        return out.transpose(1, 2)
    unbind = -2 if kind == "real_half" else -1
    return apply_rotary_emb(x, tuple(tables), use_real=True, use_real_unbind_dim=unbind)


@pytest.mark.parametrize("case", ROPE_CASES, ids=lambda c: c.id)
def test_rope_matches_diffusers(case):
    config = _config(case)
    frames, height, width = case.grid
    reference, own_rotation = _own_rotation(case.reference(case.config, case.grid))
    rope = from_diffusers(config)
    positions = diffusers_positions(config, frames=frames, height=height, width=width)
    inv_freq = rope.rope.inv_freq if isinstance(rope, MRoPE) else rope.inv_freq
    tokens = positions.shape[-1] if isinstance(rope, MRoPE) else positions.shape[0]  # [3, N]
    angle = float(positions.abs().max()) * float(inv_freq.max())
    if reference[0] != "rotate":
        cos_ref, sin_ref = _pairs(reference)
        cos, sin = rope.cos_sin(positions, dtype=torch.float64)
        assert cos.shape == cos_ref.shape, (cos.shape, cos_ref.shape)
        torch.testing.assert_close(cos, cos_ref, rtol=0, atol=_tolerance(angle))
        torch.testing.assert_close(sin, sin_ref, rtol=0, atol=_tolerance(angle))

    q = torch.randn(2, 3, tokens, rope.head_dim, generator=torch.Generator().manual_seed(0))
    expected = own_rotation(q) if own_rotation else _diffusers_rotate(q, reference)
    got, _ = rope.rotate(q, q, positions, positions)
    scale = float(q.abs().max())
    torch.testing.assert_close(got, expected, rtol=0, atol=_tolerance(angle) * scale)


@pytest.mark.parametrize("case", TABLE_CASES, ids=lambda c: c.id)
def test_sincos_table_matches_diffusers(case):
    config = _config(case)
    frames, height, width = case.grid
    (_, reference) = case.reference(case.config, case.grid)
    table = from_diffusers(config)
    positions = diffusers_positions(config, frames=frames, height=height, width=width)
    if isinstance(table, GridSinCos):
        got = table.table(positions, dtype=torch.float64)
    else:  # a 1-D table
        got = table.encoding(positions, dtype=torch.float64)
    assert got.shape == reference.shape, (got.shape, reference.shape)
    scale = float(positions.abs().max())
    torch.testing.assert_close(got, reference.double(), rtol=0, atol=_tolerance(scale))


def test_qwen_text_follows_the_centred_image():
    """Qwen-Image's text tokens sit on the diagonal from ``max(H//2, W//2)``."""
    from diffusers.models.transformers.transformer_qwenimage import QwenEmbedRope

    from posenc.diffusers import text_positions

    module = QwenEmbedRope(theta=10000, axes_dim=[4, 6, 6], scale_rope=True)
    _, text = module([(1, 6, 9)], device=torch.device("cpu"), max_txt_seq_len=5)
    rope = from_diffusers(
        "QwenImageTransformer2DModel", attention_head_dim=16, axes_dims_rope=(4, 6, 6)
    )
    cos, sin = rope.cos_sin(text_positions(5, start=max(6 // 2, 9 // 2)), dtype=torch.float64)
    atol = _tolerance(9.0)
    torch.testing.assert_close(cos, text.real.double(), rtol=0, atol=atol)
    torch.testing.assert_close(sin, text.imag.double(), rtol=0, atol=atol)


def test_sana_without_interpolation_scale_has_no_positions():
    """Sana's released configs leave ``interpolation_scale`` unset: its PatchEmbed adds nothing."""
    from diffusers.models.embeddings import PatchEmbed

    embed = PatchEmbed(height=8, width=8, patch_size=1, in_channels=4, embed_dim=16,
                       interpolation_scale=None, pos_embed_type=None)  # fmt: skip
    with torch.no_grad():
        added = embed(torch.zeros(1, 4, 8, 8))[0] - embed.proj.bias
    torch.testing.assert_close(added, torch.zeros_like(added), rtol=0, atol=0)
    assert isinstance(from_diffusers("SanaTransformer2DModel"), NoPE)


def test_transformer2d_by_input_kind():
    """Continuous inputs add no positions (no ``pos_embed``); discrete ones are refused."""
    from diffusers import Transformer2DModel

    continuous = Transformer2DModel(num_attention_heads=1, attention_head_dim=8, in_channels=4,
                                    num_layers=1, norm_num_groups=2)  # fmt: skip
    assert getattr(continuous, "pos_embed", None) is None
    assert isinstance(from_diffusers("Transformer2DModel", in_channels=4), NoPE)
    with pytest.raises(ValueError, match="num_vector_embeds"):
        from_diffusers("Transformer2DModel", num_vector_embeds=8)


def test_models_without_positions_build_nope():
    """DreamLite's blocks and TransformerTemporalModel's default blocks add no positions."""
    from diffusers.models import transformers

    for name in NOPE_CLASSES:
        cls = getattr(transformers, name)
        model = cls(num_attention_heads=1, attention_head_dim=8, in_channels=4, norm_num_groups=2)
        assert all(block.pos_embed is None for block in model.transformer_blocks)
        assert isinstance(from_diffusers(cls.__name__), NoPE)
