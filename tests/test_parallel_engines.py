"""Per-rank RoPE tables (posenc.parallel.engines) against the unsplit rotation and against
Megatron-Core's own RotaryEmbedding / YarnRotaryEmbedding and rotary application.

Each table is applied to a rank's shard by RoPE's formula (Su et al. 2021, eq. 34) written
here, and must give the rows of the one-process float64 rotation of the whole sequence; the
tables are float32, so the tolerance is float32's epsilon times the largest angle.
"""

from __future__ import annotations

import pytest
import torch

import posenc
from _megatron_cpu import Group, import_embeddings, patch_to_cpu
from posenc.parallel import (
    contiguous_layout,
    head_tail_layout,
    megatron_rope_freqs,
    thd_layout,
    torchtitan_cos_sin,
    torchtitan_freqs_cis,
)

D, H, T, N = 16, 2, 64, 2
L0 = 16  # original length of the length-aware scalings, below T
SCALINGS = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 2.0},
    "ntk": {"rope_type": "ntk", "factor": 2.0},
    "ntk_alpha": {"rope_type": "ntk_alpha", "alpha": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": L0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": L0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": L0,
    },
    "longrope": {
        "rope_type": "longrope",
        "factor": 4.0,
        "original_max_position_embeddings": L0,
        "short_factor": [1.0 + 0.1 * i for i in range(D // 2)],
        "long_factor": [1.5 + 0.5 * i for i in range(D // 2)],
    },
    "proportional": {"rope_type": "proportional", "factor": 2.0, "partial_rotary_factor": 0.5},
}
VARIANTS = {
    "half-split": {},
    "interleaved": {"interleaved": True},
    "clockwise": {"clockwise": True},
    "partial": {"rotary_dim": D // 2},
}


def _rope(name: str, **kwargs) -> posenc.RotaryEmbedding:
    scaling = SCALINGS[name]
    if name == "longrope" and "rotary_dim" in kwargs:  # one factor per rotated pair
        pairs = kwargs["rotary_dim"] // 2
        scaling = scaling | {k: scaling[k][:pairs] for k in ("short_factor", "long_factor")}
    return posenc.RotaryEmbedding(D, scaling=scaling, **kwargs)


def _rotate_pairs(x: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """The pair partner with its sign: ``(-x_b, x_a)`` for every pair ``(a, b)``."""
    if interleaved:
        return torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def _apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool):
    """RoPE with per-feature ``cos``/``sin`` ``[S, R]`` on ``x [S, H, D]``; features R.. pass."""
    r = cos.shape[-1]
    rot, rest = x[..., :r], x[..., r:]
    cos, sin = cos[:, None].double(), sin[:, None].double()
    return torch.cat([rot * cos + _rotate_pairs(rot, interleaved) * sin, rest], dim=-1)


def _unsplit(name: str, x: torch.Tensor, positions: torch.Tensor, **kwargs) -> torch.Tensor:
    """The one-process rotation of ``x [T, H, D]`` (float64) at ``positions [T]``."""
    q = x.permute(1, 0, 2)[None]  # [1, H, T, D]
    out, _ = _rope(name, **kwargs).rotate(q, q, positions, positions)
    return out[0].permute(1, 0, 2)


def _close(actual: torch.Tensor, expected: torch.Tensor, max_angle: float) -> None:
    eps = torch.finfo(torch.float32).eps
    tol = 8 * eps * (max_angle + 1) * float(expected.abs().max())
    torch.testing.assert_close(actual, expected, rtol=0, atol=tol)


LAYOUTS = {
    "contiguous": lambda r: contiguous_layout(T, N, r),
    "head-tail": lambda r: head_tail_layout(T, N, r),
    "thd": lambda r: thd_layout(torch.tensor([0, 8, 40, 40, 64]), N, r),
}


def _global_positions(kind: str) -> torch.Tensor:
    if kind != "thd":
        return torch.arange(T)
    return torch.cat([torch.arange(n) for n in (8, 32, 0, 24)])


def test_every_scaling_is_covered():
    assert set(SCALINGS) == set(posenc.scaling_types())


@pytest.mark.parametrize("kind", sorted(LAYOUTS))
@pytest.mark.parametrize(
    ("name", "variant"),
    [  # proportional sets its own rotary_dim (partial_rotary_factor)
        (n, v)
        for n in sorted(SCALINGS)
        for v in sorted(VARIANTS)
        if (n, v) != ("proportional", "partial")
    ],
)
def test_megatron_freqs_give_the_unsplit_rotation(name, kind, variant):
    kwargs = VARIANTS[variant]
    x = torch.randn(T, H, D, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    expected = _unsplit(name, x, _global_positions(kind), **kwargs)
    rope = _rope(name, **kwargs)
    for rank in range(N):
        layout = LAYOUTS[kind](rank)
        freqs, scale = megatron_rope_freqs(rope, layout)
        assert freqs.shape == (layout.indices.numel(), 1, 1, rope.rotary_dim)
        assert freqs.dtype == torch.float32
        cos, sin = freqs[:, 0, 0].cos() * scale, freqs[:, 0, 0].sin() * scale
        got = _apply(x[layout.indices], cos, sin, rope.interleaved)
        _close(got, expected[layout.indices], float(freqs.abs().max()))


@pytest.mark.parametrize("variant", ["half-split", "clockwise", "interleaved"])
@pytest.mark.parametrize("name", sorted(SCALINGS))
def test_torchtitan_tables_looked_up_by_positions_give_the_unsplit_rotation(name, variant):
    kwargs = VARIANTS[variant]
    x = torch.randn(T, H, D, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    expected = _unsplit(name, x, torch.arange(T), **kwargs)
    rope = _rope(name, **kwargs)
    r = rope.rotary_dim
    freqs_cis = torchtitan_freqs_cis(rope, T)
    cos_sin = torchtitan_cos_sin(rope, T)
    assert freqs_cis.shape == (T, r // 2) and freqs_cis.dtype == torch.complex64
    assert cos_sin.shape == (T, 2 * r) and cos_sin.dtype == torch.float32
    for rank in range(N):
        layout = head_tail_layout(T, N, rank)
        rows = freqs_cis[layout.positions]  # torchtitan: the positions sharded with the inputs
        if rope.interleaved:  # ComplexRoPE: adjacent pairs as complex numbers
            cos, sin = (v.repeat_interleave(2, dim=-1) for v in (rows.real, rows.imag))
        else:
            cos, sin = rows.real.repeat(1, 2), rows.imag.repeat(1, 2)
        got = _apply(x[layout.indices], cos, sin, rope.interleaved)
        _close(got, expected[layout.indices], float(rows.angle().abs().max()) + T)
        if not rope.interleaved:  # CosSinRoPE: half-split, cos then sin
            table = cos_sin[layout.positions]
            got = _apply(x[layout.indices], table[:, :r], table[:, r:], False)
            _close(got, expected[layout.indices], T)


def test_length_dependent_scaling_follows_the_unsplit_length():
    layout = head_tail_layout(T, N, 0)
    freqs, _ = megatron_rope_freqs(_rope("dynamic"), layout)
    shard_only, _ = megatron_rope_freqs(_rope("dynamic"), layout, length=T // N)
    unsplit = _rope("dynamic")
    unsplit.observe_length(T)
    want = layout.positions[:, None].double() * unsplit.inv_freq
    torch.testing.assert_close(freqs[:, 0, 0, : D // 2].double(), want, rtol=2e-7, atol=0)
    assert not torch.allclose(shard_only, freqs)  # the shard's own length is the wrong one


def test_bad_input_raises_naming_the_value():
    layout = head_tail_layout(T, N, 0)
    with pytest.raises(TypeError, match=r"posenc\.RotaryEmbedding, got ALiBi"):
        megatron_rope_freqs(posenc.ALiBi(2), layout)
    with pytest.raises(ValueError, match="XPos scales queries and keys"):
        megatron_rope_freqs(posenc.XPos(D), layout)
    with pytest.raises(TypeError, match="ShardLayout, got Tensor"):
        megatron_rope_freqs(_rope("default"), torch.arange(T))
    with pytest.raises(ValueError, match="max_len must be >= 1, got 0"):
        torchtitan_freqs_cis(_rope("default"), 0)
    with pytest.raises(ValueError, match="length must be >= 0, got -1"):
        torchtitan_cos_sin(_rope("default"), T, length=-1)


# ---------------------------------------------------------------- Megatron-Core's own functions


@pytest.fixture(scope="module")
def megatron():
    return import_embeddings()


@pytest.fixture
def cpu_megatron(megatron, monkeypatch):
    patch_to_cpu(megatron[0], monkeypatch)
    return megatron


MEGATRON_CASES = {
    # name: (Megatron's RotaryEmbedding keywords, posenc's RotaryEmbedding keywords)
    "default": ({}, {}),
    "base": ({"rotary_base": 500000}, {"base": 500000.0}),
    "linear": (
        {"seq_len_interpolation_factor": 4.0},
        {"scaling": SCALINGS["linear"] | {"factor": 4.0}},
    ),
    "llama3": (
        {"rope_scaling": True, "rope_scaling_factor": 8.0},
        {"scaling": SCALINGS["llama3"] | {"original_max_position_embeddings": 8192}},
    ),
    "interleaved": ({"rotary_interleaved": True}, {"interleaved": True}),
    "partial": ({"rotary_percent": 0.5}, {"rotary_dim": D // 2}),
}


@pytest.mark.parametrize("case", sorted(MEGATRON_CASES))
@pytest.mark.parametrize("size", [1, 2, 4])
def test_equals_megatron_rotary_embedding_on_each_rank(cpu_megatron, case, size):
    _, megatron_rope, _ = cpu_megatron
    theirs_kwargs, ours_kwargs = MEGATRON_CASES[case]
    theirs_kwargs = {"rotary_percent": 1.0} | theirs_kwargs
    theirs = megatron_rope(kv_channels=D, use_cpu_initialization=True, **theirs_kwargs)
    ours = posenc.RotaryEmbedding(D, **ours_kwargs)
    for rank in range(size):
        want = theirs.forward(T, cp_group=Group(size, rank))
        got, scale = megatron_rope_freqs(ours, head_tail_layout(T, size, rank))
        assert scale == 1.0 and got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=16 * torch.finfo(torch.float32).eps, atol=0)


@pytest.mark.parametrize("size", [1, 2])
def test_equals_megatron_yarn_and_its_mscale(cpu_megatron, size):
    _, _, megatron_yarn = cpu_megatron
    theirs = megatron_yarn(
        kv_channels=D, use_cpu_initialization=True, scaling_factor=4.0,
        original_max_position_embeddings=L0,
    )  # fmt: skip
    ours = _rope("yarn")
    for rank in range(size):
        want, want_scale = theirs.forward(T, cp_group=Group(size, rank))
        got, scale = megatron_rope_freqs(ours, head_tail_layout(T, size, rank))
        torch.testing.assert_close(got, want, rtol=16 * torch.finfo(torch.float32).eps, atol=0)
        assert scale == pytest.approx(want_scale, rel=1e-12)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("size", [1, 2, 4])
def test_thd_equals_megatron_apply_rotary_pos_emb_thd(cpu_megatron, size, interleaved):
    rope_utils, megatron_rope, _ = cpu_megatron
    theirs = megatron_rope(
        kv_channels=D, rotary_percent=1.0, rotary_interleaved=interleaved,
        use_cpu_initialization=True,
    )  # fmt: skip
    ours = posenc.RotaryEmbedding(D, interleaved=interleaved)
    cu = torch.tensor([0, 8, 40, 40, 64], dtype=torch.int32) * size // 2
    lengths = (cu[1:] - cu[:-1]).tolist()
    # Megatron reads a table of max_s rows by each document's own positions, and one of
    # cu_seqlens[-1] rows (one per packed token, with its document's offset) as it stands
    table = theirs.forward(max(lengths), packed_seq=True)  # [max_s, 1, 1, D], not split
    per_token = table[torch.cat([torch.arange(n) for n in lengths])]
    gen = torch.Generator().manual_seed(2)
    for rank in range(size):
        layout = thd_layout(cu, size, rank)
        t = torch.randn(layout.indices.numel(), H, D, generator=gen)  # the rank's packed shard
        want, exact = (
            rope_utils._apply_rotary_pos_emb_thd(
                t, cu, freqs, rotary_interleaved=interleaved, cp_group=Group(size, rank)
            )
            for freqs in (table, per_token)
        )
        torch.testing.assert_close(exact, want, rtol=0, atol=0)
        freqs, scale = megatron_rope_freqs(ours, layout)
        got = rope_utils._apply_rotary_pos_emb_bshd(
            t[:, None], freqs, rotary_interleaved=interleaved, mscale=scale
        )[:, 0]
        _close(got, want, float(freqs.abs().max()))
        q = t.permute(1, 0, 2)[None].double()  # posenc itself, at the layout's positions
        rotated, _ = ours.rotate(q, q, layout.positions, layout.positions)
        _close(rotated[0].permute(1, 0, 2).float(), want, float(freqs.abs().max()))
