"""posenc.RotaryEmbedding against the float64 reference; properties, numerics, caches."""

from __future__ import annotations

import copy
import pickle
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posenc
from conftest import tolerances
from posenc import (
    DynamicNTKScaling,
    LongRopeScaling,
    RotaryEmbedding,
    YarnScaling,
    rerotate_keys,
    rope_cos_sin,
    rope_inv_freq,
    rope_weight_to_half_split,
    rope_weight_to_interleaved,
)
from posenc.reference import rope as ref

TIGHT = tolerances(torch.float64)
B, H, HKV, T, D = 2, 4, 2, 7, 16


def qk(gen: torch.Generator, dtype=torch.float64, t_q: int = T, t_k: int = T):
    q = torch.randn(B, H, t_q, D, generator=gen, dtype=torch.float64).to(dtype)
    k = torch.randn(B, HKV, t_k, D, generator=gen, dtype=torch.float64).to(dtype)
    return q, k


def reference(x: torch.Tensor, positions, module: RotaryEmbedding) -> torch.Tensor:
    theta = module.inv_freq.numpy()
    out = ref.rope_rotate(
        x.double().numpy(),
        np.asarray(positions),
        theta,
        interleaved=module.interleaved,
        attention_scale=module.attention_scale,
    )
    return torch.from_numpy(out)


POSITIONS = {
    "default": (None, 0, np.arange(T)),
    "vector": (torch.tensor([3, 1, 4, 1, 5, 9, 2]), 0, np.array([3, 1, 4, 1, 5, 9, 2])),
    "packed": (
        torch.tensor([[0, 1, 2, 0, 1, 2, 3], [0, 0, 0, 1, 2, 3, 4]]),
        0,
        np.array([[0, 1, 2, 0, 1, 2, 3], [0, 0, 0, 1, 2, 3, 4]]),
    ),
    "offset": (None, 1000, np.arange(1000, 1000 + T)),
    "float": (torch.linspace(-2.5, 40.25, T, dtype=torch.float64), 0, np.linspace(-2.5, 40.25, T)),
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", sorted(POSITIONS))
@pytest.mark.parametrize(
    ("interleaved", "rotary_dim"), [(False, None), (True, None), (False, 8), (True, 4)]
)
def test_matches_reference(gen, dtype, kind, interleaved, rotary_dim):
    module = RotaryEmbedding(D, rotary_dim=rotary_dim, interleaved=interleaved, max_len=4)
    positions, offset, ref_positions = POSITIONS[kind]
    q, k = qk(gen, dtype)
    out_q, out_k = module(q, k, positions, offset=offset)
    assert out_q.dtype == out_k.dtype == dtype
    tol = TIGHT if dtype == torch.float64 else tolerances(dtype)
    torch.testing.assert_close(out_q.double(), reference(q, ref_positions, module), **tol)
    torch.testing.assert_close(out_k.double(), reference(k, ref_positions, module), **tol)


def test_scaled_module_matches_reference(gen):
    module = RotaryEmbedding(D, base=5e5, scaling=YarnScaling(4.0, 64))
    q, k = qk(gen)
    out_q, _ = module(q, k)
    theta = ref.yarn_frequencies(D, 5e5, 4.0, 64)
    expected = ref.rope_rotate(
        q.numpy(), np.arange(T), theta, attention_scale=ref.yarn_attention_factor(4.0)
    )
    torch.testing.assert_close(out_q, torch.from_numpy(expected), **TIGHT)


def test_rotate_different_lengths_and_heads(gen):
    module = RotaryEmbedding(D)
    q, k = qk(gen, t_q=1, t_k=5)
    out_q, out_k = module.rotate(q, k, torch.tensor([9]), torch.arange(5, 10))
    torch.testing.assert_close(out_q, reference(q, [9], module), **TIGHT)
    torch.testing.assert_close(out_k, reference(k, np.arange(5, 10), module), **TIGHT)
    # forward with no positions: the queries are the last Tq of the keys' positions
    fq, fk = module(q, k, offset=5)
    torch.testing.assert_close(fq, out_q, rtol=0, atol=0)
    torch.testing.assert_close(fk, out_k, rtol=0, atol=0)


def test_kv_cache_decoding_equals_full_forward(gen):
    module = RotaryEmbedding(D, rotary_dim=12)
    q, k = qk(gen)
    full_q, full_k = module(q, k)
    steps = [module(q[:, :, t : t + 1], k[:, :, t : t + 1], offset=t) for t in range(T)]
    torch.testing.assert_close(torch.cat([s[0] for s in steps], 2), full_q, rtol=0, atol=0)
    torch.testing.assert_close(torch.cat([s[1] for s in steps], 2), full_k, rtol=0, atol=0)


def test_partial_rotary_passes_the_rest_and_inputs_are_unchanged(gen):
    q, k = qk(gen)
    q0, k0 = q.clone(), k.clone()
    out_q, _ = RotaryEmbedding(D, rotary_dim=6)(q, k, torch.arange(T) + 3)
    torch.testing.assert_close(out_q[..., 6:], q[..., 6:], rtol=0, atol=0)
    assert not torch.equal(out_q[..., :6], q[..., :6])
    assert torch.equal(q, q0) and torch.equal(k, k0)


# --------------------------------------------------------------------------- properties

vectors = st.lists(st.floats(-3, 3), min_size=D, max_size=D).map(
    lambda v: torch.tensor(v, dtype=torch.float64)
)
positions_st = st.integers(-5000, 5000)


def rotate_one(module: RotaryEmbedding, x: torch.Tensor, position: int) -> torch.Tensor:
    out, _ = module.rotate(
        x.view(1, 1, 1, D), x.view(1, 1, 1, D), torch.tensor([position]), torch.tensor([position])
    )
    return out.view(D)


@pytest.mark.parametrize("interleaved", [False, True])
@given(q=vectors, k=vectors, m=positions_st, n=positions_st, shift=positions_st)
def test_score_depends_only_on_relative_position(interleaved, q, k, m, n, shift):
    module = RotaryEmbedding(D, interleaved=interleaved, rotary_dim=12)
    score = rotate_one(module, q, m) @ rotate_one(module, k, n)
    shifted = rotate_one(module, q, m + shift) @ rotate_one(module, k, n + shift)
    # angles up to 1e4 rad: cos/sin carry ~|angle| * eps of error
    assert float(score) == pytest.approx(
        float(shifted), abs=1e4 * 64 * np.finfo(float).eps * (1 + float(q.norm() * k.norm()))
    )


@given(x=vectors, m=positions_st)
def test_norm_preserved(x, m):
    out = rotate_one(RotaryEmbedding(D, base=500.0), x, m)
    assert float(out.norm()) == pytest.approx(float(x.norm()), rel=1e-12, abs=1e-12)


@given(x=vectors)
def test_position_zero_is_identity(x):
    for interleaved in (False, True):
        out = rotate_one(RotaryEmbedding(D, interleaved=interleaved), x, 0)
        assert torch.equal(out, x)


def test_rotation_matrix_form():
    module = RotaryEmbedding(D, interleaved=True)
    eye = torch.eye(D, dtype=torch.float64).view(1, 1, D, D)
    rows, _ = module.rotate(eye, eye, torch.full((D,), 11), torch.full((D,), 11))
    matrix = ref.rope_rotation_matrix(11, module.inv_freq.numpy(), D, interleaved=True)
    torch.testing.assert_close(rows[0, 0].T, torch.from_numpy(matrix), **TIGHT)


# --------------------------------------------------------------------------- numerics and caches


def test_bf16_module_keeps_exact_frequencies_far_out(gen):
    fp32 = RotaryEmbedding(64)
    bf16 = RotaryEmbedding(64).to(torch.bfloat16)
    positions = torch.arange(100_000, 100_016)
    q = torch.randn(1, 2, 16, 64, generator=gen)
    want_q, _ = fp32(q, q, positions)
    got_q, _ = bf16(q.bfloat16(), q.bfloat16(), positions)
    assert got_q.dtype == torch.bfloat16
    torch.testing.assert_close(
        got_q.float(), want_q.bfloat16().float(), **tolerances(torch.bfloat16)
    )
    assert list(bf16.buffers()) == [] and bf16.inv_freq.dtype == torch.float64


def test_cache_grows_and_matches_direct_computation():
    module = RotaryEmbedding(D, max_len=8)
    short = module.cos_sin(torch.arange(5))
    long = module.cos_sin(torch.arange(3000))
    direct = rope_cos_sin(torch.arange(3000), module.inv_freq)
    torch.testing.assert_close(long, direct, rtol=0, atol=0)
    torch.testing.assert_close(short, tuple(t[:5] for t in direct), rtol=0, atol=0)
    assert module.cos_sin(torch.arange(4))[0].dtype == torch.float32
    assert module.cos_sin(torch.arange(4), dtype=torch.float64)[0].dtype == torch.float64


def test_concurrent_cache_growth_is_consistent():
    module = RotaryEmbedding(D, max_len=2)
    lengths = [17, 3, 900, 64, 2000, 5, 1500, 33] * 4
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda n: module.cos_sin(torch.arange(n))[0], lengths))
    for n, cos in zip(lengths, results, strict=True):
        torch.testing.assert_close(
            cos, rope_cos_sin(torch.arange(n), module.inv_freq)[0], rtol=0, atol=0
        )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_follows_device_moves(gen):
    module = RotaryEmbedding(D, scaling=YarnScaling(4.0, 64))
    q, k = qk(gen, torch.float32)
    cpu = module(q, k, torch.arange(T) + 500)
    gpu = module.cuda()(q.cuda(), k.cuda(), (torch.arange(T) + 500).cuda())
    for a, b in zip(cpu, gpu, strict=True):
        assert b.device.type == "cuda"
        torch.testing.assert_close(b.cpu(), a, **tolerances(torch.float32))


def test_copy_and_pickle(gen):
    module = RotaryEmbedding(
        D, scaling={"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 4}
    )
    module.register_frequency_hook(lambda change: None)
    q, k = qk(gen)
    for clone in (copy.deepcopy(module), pickle.loads(pickle.dumps(module))):
        torch.testing.assert_close(clone(q, k), module(q, k), rtol=0, atol=0)


# --------------------------------------------------------------------------- weight layouts


def hf_llama_permute(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """The permutation Hugging Face's Llama conversion script applies to Meta's wq/wk."""
    rows, cols = w.shape
    return w.view(num_heads, rows // num_heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


@pytest.mark.parametrize("rotary_dim", [None, 8])
def test_weight_permutation_moves_checkpoints_between_layouts(gen, rotary_dim):
    c = 24
    w_q = torch.randn(H * D, c, generator=gen, dtype=torch.float64)
    w_k = torch.randn(HKV * D, c, generator=gen, dtype=torch.float64)
    x = torch.randn(B, T, c, generator=gen, dtype=torch.float64)

    def project(w, heads):  # [B, T, C] -> [B, heads, T, D]
        return (x @ w.T).view(B, T, heads, D).transpose(1, 2)

    half = RotaryEmbedding(D, rotary_dim=rotary_dim)
    inter = RotaryEmbedding(D, rotary_dim=rotary_dim, interleaved=True)
    hq, hk = half(project(w_q, H), project(w_k, HKV))
    iw_q = rope_weight_to_interleaved(w_q, H, rotary_dim=rotary_dim)
    iw_k = rope_weight_to_interleaved(w_k, HKV, rotary_dim=rotary_dim)
    iq, ik = inter(project(iw_q, H), project(iw_k, HKV))
    scores_half = hq @ hk.repeat_interleave(H // HKV, 1).transpose(-1, -2)
    scores_inter = iq @ ik.repeat_interleave(H // HKV, 1).transpose(-1, -2)
    # a dot product over D terms of size |q||k|: its rounding is D * eps * |q| |k|
    atol = D * float(hq.abs().max() * hk.abs().max()) * TIGHT["atol"]
    torch.testing.assert_close(scores_inter, scores_half, rtol=0, atol=atol)
    # the rotated features are the same numbers, permuted like the weight rows
    eye = torch.eye(D, dtype=torch.float64)
    perm = rope_weight_to_interleaved(eye, 1, rotary_dim=rotary_dim)
    torch.testing.assert_close(iq, hq @ perm.T, **TIGHT)
    assert torch.equal(rope_weight_to_half_split(iw_q, H, rotary_dim=rotary_dim), w_q)
    bias = torch.randn(H * D, generator=gen)
    assert torch.equal(rope_weight_to_half_split(rope_weight_to_interleaved(bias, H), H), bias)


def test_half_split_permutation_is_hf_conversion(gen):
    meta = torch.randn(H * D, 12, generator=gen)
    assert torch.equal(rope_weight_to_half_split(meta, H), hf_llama_permute(meta, H))


# --------------------------------------------------------------------------- length policy


def dynamic_module(**kw) -> RotaryEmbedding:
    return RotaryEmbedding(D, scaling=DynamicNTKScaling(2.0, 16), **kw)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(
    ("old", "new"),
    [
        (
            dict(scaling=DynamicNTKScaling(2.0, 4096), seq_len=5000),
            dict(scaling=DynamicNTKScaling(2.0, 4096), seq_len=9000),
        ),
        (dict(scaling=None), dict(scaling=YarnScaling(4.0, 256))),
    ],
)
def test_rerotate_keys_equals_direct_rotation(gen, dtype, old, new):
    freqs_a = rope_inv_freq(D, dtype=torch.float64, **old)
    freqs_b = rope_inv_freq(D, dtype=torch.float64, **new)
    _, k = qk(gen, dtype)
    positions = torch.arange(4990, 4990 + T)

    def rotate(freqs):
        cos, sin = rope_cos_sin(positions, freqs[0], attention_scale=freqs[1], dtype=torch.float64)
        return posenc.apply_rope(k, cos, sin)

    moved = rerotate_keys(rotate(freqs_a), positions, old=freqs_a, new=freqs_b)
    # float64 carries the rounding of angles near 5000 rad (~5000 eps); lower precisions
    # are dominated by their own rounding
    tol = tolerances(dtype, ops=8 + 5000) if dtype == torch.float64 else tolerances(dtype)
    torch.testing.assert_close(moved, rotate(freqs_b), **tol)


def test_dynamic_frequencies_follow_the_longest_length_seen(gen):
    module = dynamic_module()
    changes = []
    module.register_frequency_hook(changes.append)
    default = module.inv_freq
    q, k = qk(gen, t_q=8, t_k=8)
    module(q, k)  # length 8 <= 16: default frequencies
    assert changes == [] and module.seen_length == 8
    module(q, k, offset=12)  # length 20
    assert len(changes) == 1 and changes[0].length == 20
    assert torch.equal(changes[0].old[0], default)
    want, _ = rope_inv_freq(D, scaling=DynamicNTKScaling(2.0, 16), seq_len=20, dtype=torch.float64)
    assert torch.equal(module.inv_freq, want) and torch.equal(changes[0].new[0], want)
    module(q, k, offset=4)  # length 12: no change, the longest length stays 20
    assert len(changes) == 1 and module.seen_length == 20
    assert module.reset_length() is not None and torch.equal(module.inv_freq, default)
    assert len(changes) == 2


def test_decoding_with_rerotated_cache_matches_one_shot(gen):
    """A cache kept consistent through frequency changes equals rotating all keys at once."""
    module = dynamic_module()
    steps = 40
    k = torch.randn(1, HKV, steps, D, generator=gen, dtype=torch.float64)
    cache: list[torch.Tensor] = []

    def on_change(change):
        if cache:
            cached = torch.cat(cache, 2)
            cache[:] = [
                rerotate_keys(cached, torch.arange(cached.shape[2]), old=change.old, new=change.new)
            ]

    module.register_frequency_hook(on_change)
    for t in range(steps):
        _, k_t = module(k[:, :1, :1], k[:, :, t : t + 1], offset=t)
        cache.append(k_t)
    one_shot = dynamic_module()
    one_shot.observe_length(steps)
    _, want = one_shot(k[:, :1, :1], k)
    torch.testing.assert_close(torch.cat(cache, 2), want, rtol=1e-12, atol=1e-12)


def test_pinned_length_never_changes_while_decoding(gen):
    module = RotaryEmbedding(D, scaling=LongRopeScaling([1.0] * 8, [4.0] * 8, 16, 4.0))
    assert module.observe_length(64) is not None
    changes = []
    module.register_frequency_hook(changes.append)
    q, k = qk(gen, t_q=1, t_k=1)
    for t in range(64):
        module(q, k, offset=t)
    assert changes == []


# --------------------------------------------------------------------------- registry and bad input


def test_registered_and_buildable():
    module = posenc.build("rope", d_model=64, num_heads=4, head_dim=16, max_len=128, causal=True)
    assert isinstance(module, RotaryEmbedding) and module.head_dim == 16
    assert module.sites == posenc.Site.QK


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: RotaryEmbedding(15), "head_dim must be even, got 15"),
        (lambda: RotaryEmbedding(16, rotary_dim=5), "rotary_dim must be even, got 5"),
        (lambda: RotaryEmbedding(16, rotary_dim=32), "rotary_dim=32 exceeds head_dim=16"),
        (lambda: RotaryEmbedding(16, scaling={"rope_type": "nope"}), "unknown rope_type 'nope'"),
        (lambda: RotaryEmbedding(16, scaling={"rope_type": "linear", "factor": 0}), "got 0"),
        (lambda: RotaryEmbedding(16, scaling={"rope_type": "yarn", "factor": 2}), "original_max"),
        (lambda: RotaryEmbedding(16, max_len=0), "max_len must be >= 1, got 0"),
    ],
)
def test_bad_construction_raises(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_bad_call_raises(gen):
    module = RotaryEmbedding(D)
    q, k = qk(gen)
    with pytest.raises(
        ValueError, match=r"head_dim=16, got q \(2, 4, 7, 16\) and k \(2, 2, 7, 8\)"
    ):
        module(q, k[..., :8])
    with pytest.raises(ValueError, match=r"T = 7, got shape \(6,\)"):
        module(q, k, torch.arange(6))
    with pytest.raises(ValueError, match=r"T = 7, got shape \(5,\)"):
        module.rotate(q, k, torch.arange(7), torch.arange(5))
    with pytest.raises(ValueError, match="batch size 3"):
        module(q, k, torch.zeros(3, T, dtype=torch.long))
    with pytest.raises(ValueError, match="q is longer than k"):
        module(q, k[:, :, :3])
    with pytest.raises(ValueError, match="offset must be >= 0, got -1"):
        module(q, k, offset=-1)
    with pytest.raises(TypeError, match="bfloat16"):
        module(q, k, torch.arange(T).bfloat16())
    with pytest.raises(ValueError, match="q has batch 2 but k has batch 1"):
        module(q, k[:1])
