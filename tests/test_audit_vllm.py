"""vLLM's reading (``posenc.audit.vllm``) against the paper's formulas and posenc's plan.

Shapes: ``P`` positions, ``R`` rotary dim. vLLM runs in its own environment
(``scripts/setup_vllm.sh`` makes ``.venv-vllm``); the tests that need it are slow (one worker
run reads every case, about a minute on 2 cores) and skipped, saying so, when it is absent.

vLLM computes its cos/sin tables in float32: an angle ``p theta`` carries the float32
rounding of ``theta`` and of the product, and the probe reads it back through float32
cos/sin, so angles are compared with ``rtol = 16 eps32`` and ``atol = 16 eps32``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from _audit_configs import (
    BASE,
    CONFIGS,
    CONTEXT,
    DEEPSEEK_MSCALE,
    EPS32,
    GEMMA3,
    L0,
    LONG,
    MAX,
    POSITIONS,
    SHORT,
    TOL,
    D,
)
from posenc.audit.hfread import read_posenc, read_transformers
from posenc.audit.paper import read_paper
from posenc.audit.vllm import read_vllm, read_vllm_jobs, vllm_python
from posenc.reference import rope as ref


def _rope(source: str, **kwargs: object) -> dict:
    return {"get_rope": {"head_size": D, "max_position": MAX, **kwargs}, "source": source}


def _params(**kwargs: object) -> dict:
    return {"rope_parameters": {"rope_theta": BASE, "rope_type": "default", **kwargs}}


ROPES = {  # the parts built without a decoder: get_rope as that model file calls it
    "ntk_alpha": _rope("models/hy_v3.py", **_params(rope_type="dynamic", alpha=1000.0)),
    "mrope": _rope("models/qwen2_vl.py", **_params(mrope_section=[2, 3, 3])),
    "bailing_mrope": _rope(
        "models/bailing_moe_v3.py",
        is_neox_style=False,
        **_params(rope_type="bailing_mrope", mrope_section=[2, 3, 3]),
    ),
    "ernie_mrope": {
        "rope_class": "ernie45_vl_rope.Ernie4_5_VLRotaryEmbedding",
        "get_rope": {
            "head_size": D,
            "rotary_dim": D,
            "max_position_embeddings": MAX,
            "base": BASE,
            "is_neox_style": False,
            "dtype": "float32",
            "mrope_section": [2, 2, 4],  # h, w, t as models/ernie45_vl_moe.py orders them
        },
        "source": "models/ernie45_vl_moe.py",
    },
    "fope": {
        **_rope(
            "models/interns1_pro.py",
            **_params(
                use_fope=True,
                num_key_value_heads=2,
                num_inv_freq=6,
                fope_sep_head=True,
                fope_init_factor=0.1,
            ),
        ),
        "fope_coefficients": "identity",
    },
}
PATCHES = 16  # Llama 4's vision rope: a 4 x 4 patch grid and the CLS token
LLAMA4_VISION = _rope(
    "models/mllama4.py",
    max_position=PATCHES,
    is_neox_style=False,
    dtype="complex64",
    rope_parameters={"rope_type": "mllama4", "rope_theta": BASE, "partial_rotary_factor": 0.5},
)


LLAMA31_8B = {  # Llama 3.1 8B's config.json (sizes and rope fields); vLLM builds it cut down
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 32,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
}


@pytest.fixture(scope="module")
def vllm_readings():
    if vllm_python() is None:
        pytest.skip("vLLM's environment .venv-vllm is absent (bash scripts/setup_vllm.sh)")
    names = [*CONFIGS, *ROPES, "llama31_8b", "gemma3"]
    jobs = [
        *({"config": c} for c in CONFIGS.values()),
        *ROPES.values(),
        {"config": LLAMA31_8B},
        {"config": GEMMA3},
    ]
    readings = dict(zip(names, read_vllm_jobs(jobs, POSITIONS, context=CONTEXT), strict=True))
    phi3 = [{"config": CONFIGS["longrope"]}, {"config": CONFIGS["longrope"], "max_model_len": MAX}]
    short = read_vllm_jobs(phi3, POSITIONS[:5], context=300)
    readings["longrope_300"], readings["longrope_300_served_2048"] = short
    vision = read_vllm_jobs([LLAMA4_VISION], np.arange(PATCHES + 1), context=PATCHES + 1)
    readings["llama4_vision"] = vision[0]
    for name, reading in readings.items():
        assert reading.fields.get("vllm.version") or reading.note, name
    return readings


def _angles(theta: np.ndarray, positions: np.ndarray = POSITIONS) -> np.ndarray:
    return positions[:, None].astype(np.float64) * theta[None, :]


def _check(reading, theta, *, scale=1.0, pairs="half", layers=(0,)) -> None:
    assert reading.ran, reading.note
    for i in layers:
        layer = reading.layers[i]
        assert (layer.rotates, layer.pairs, layer.rotary_dim) == (True, pairs, 2 * len(theta))
        np.testing.assert_allclose(layer.angles, _angles(theta, reading.positions), **TOL)
        np.testing.assert_allclose(layer.scale, scale, **TOL)


STANDARD = {  # vLLM equals the paper's formula (and posenc, checked below) on these
    "default": (ref.rope_frequencies(D, BASE), 1.0),
    "linear": (ref.linear_frequencies(D, BASE, 4.0), 1.0),
    # vLLM's dynamic NTK is fixed at max_position (its max_trained_positions defaults to it):
    # unscaled, as transformers is up to max_position_embeddings
    "dynamic": (ref.dynamic_ntk_frequencies(D, BASE, 4.0, MAX, CONTEXT), 1.0),
    "yarn": (ref.yarn_frequencies(D, BASE, 4.0, L0), ref.yarn_attention_factor(4.0)),
    "llama3": (ref.llama3_frequencies(D, BASE, 8.0, 1.0, 4.0, L0), 1.0),
    "longrope": (
        ref.longrope_frequencies(D, BASE, SHORT, LONG, L0, CONTEXT),
        ref.longrope_attention_factor(MAX / L0, L0),
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(STANDARD))
def test_standard_rope_types_match_the_formula_and_posenc(vllm_readings, name):
    theta, scale = STANDARD[name]
    reading = vllm_readings[name]
    _check(reading, theta, scale=scale, layers=(0, 1))
    for other in (read_posenc, read_transformers):
        theirs = other(CONFIGS[name], POSITIONS, context=CONTEXT)
        for mine, them in zip(reading.layers, theirs.layers, strict=True):
            assert (mine.pairs, mine.rotary_dim) == (them.pairs, them.rotary_dim)
            np.testing.assert_allclose(mine.angles, them.angles, **TOL)
            np.testing.assert_allclose(mine.scale, them.scale, **TOL)


@pytest.mark.slow
def test_a_released_size_config_builds_cut_down_with_its_positions(vllm_readings):
    """Llama 3.1 8B's config (32 GB of float32 weights) builds with its widths, vocabulary and
    heads cut; all 32 layers keep the 128-dim head and the Llama 3.1 frequencies."""
    reading = vllm_readings["llama31_8b"]
    assert reading.ran, reading.note
    paper = read_paper(LLAMA31_8B, POSITIONS, context=CONTEXT)
    assert len(reading.layers) == len(paper.layers) == 32
    for mine, theirs in zip(reading.layers, paper.layers, strict=True):
        assert (mine.head_dim, mine.rotary_dim, mine.pairs) == (128, 128, "half")
        np.testing.assert_allclose(mine.angles, theirs.angles, **TOL)
        np.testing.assert_allclose(mine.scale, theirs.scale, **TOL)


@pytest.mark.slow
def test_per_layer_types_and_windows_match_transformers(vllm_readings):
    """Gemma 3: vLLM's sliding layers at the local base with their window, the full layer at
    the global base with linear scaling, layer by layer as transformers runs them."""
    reading = vllm_readings["gemma3"]
    theirs = read_transformers(GEMMA3, POSITIONS, context=CONTEXT)
    assert reading.ran, reading.note
    for mine, them in zip(reading.layers, theirs.layers, strict=True):
        assert mine.sliding_window == them.sliding_window
        np.testing.assert_allclose(mine.angles, them.angles, **TOL)
        np.testing.assert_allclose(mine.scale, them.scale, **TOL)
    assert [layer.sliding_window for layer in reading.layers] == [128] * 5 + [None]


@pytest.mark.slow
def test_longrope_follows_max_model_len_not_the_sequence(vllm_readings):
    """LongRoPE (Ding et al. 2024) and transformers use the short factors for a sequence
    within L0. vLLM 0.32 picks once, from --max-model-len: served for 300 tokens it agrees;
    served for 2048, a 300-token sequence gets the long factors (so that the KV cache stays
    valid past L0), and vLLM is the one that differs from the paper."""
    pos = POSITIONS[:5]
    short = _angles(ref.longrope_frequencies(D, BASE, SHORT, LONG, L0, 300), pos)
    long = _angles(ref.longrope_frequencies(D, BASE, SHORT, LONG, L0, MAX), pos)
    theirs = read_transformers(CONFIGS["longrope"], pos, context=300)
    np.testing.assert_allclose(theirs.layers[0].angles, short, **TOL)
    np.testing.assert_allclose(vllm_readings["longrope_300"].layers[0].angles, short, **TOL)
    served_long = vllm_readings["longrope_300_served_2048"]
    assert served_long.fields["vllm.max_model_len"] == MAX
    np.testing.assert_allclose(served_long.layers[0].angles, long, **TOL)
    assert not np.allclose(served_long.layers[0].angles, short, **TOL)


@pytest.mark.slow
def test_ntk_alpha_is_the_alpha_stretched_base(vllm_readings):
    _check(vllm_readings["ntk_alpha"], ref.ntk_frequencies(D, BASE, 1000.0))
    assert (
        vllm_readings["ntk_alpha"].fields["vllm.rotary_class"] == "DynamicNTKAlphaRotaryEmbedding"
    )
    hunyuan = vllm_readings["hunyuan_ntk_alpha"]  # vLLM 0.32 serves HunYuan-V1 via transformers
    assert not hunyuan.ran and "transformers backend" in hunyuan.note


@pytest.mark.slow
def test_deepseek_yarn_scale_and_softmax(vllm_readings):
    """DeepSeek-V2's YaRN: adjacent pairs on the rope head, cos/sin times
    mscale(s, mscale) / mscale(s, mscale_all_dim), softmax scale times mscale_all_dim's squared."""
    reading = vllm_readings["deepseek_yarn"]
    ratio = ref.yarn_attention_factor(4.0, mscale=DEEPSEEK_MSCALE, mscale_all_dim=DEEPSEEK_MSCALE)
    _check(reading, ref.yarn_frequencies(D, BASE, 4.0, L0), scale=ratio, pairs="adjacent")
    mscale = 1.0 + 0.1 * DEEPSEEK_MSCALE * math.log(4.0)
    expected = (2 * D) ** -0.5 * mscale**2  # qk head = nope + rope dims
    assert math.isclose(reading.layers[0].softmax_scale, expected, rel_tol=4 * EPS32)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "pairs", "axes"),
    [
        ("mrope", "half", [0, 0, 1, 1, 1, 2, 2, 2]),  # t, h, w sections in turn
        ("ernie_mrope", "adjacent", [1, 2, 1, 2, 0, 0, 0, 0]),  # h, w interleaved, then t
        ("bailing_mrope", "adjacent", [1, 2, 1, 2, 1, 2, 0, 0]),
    ],
)
def test_mrope_text_positions_and_pair_axes(vllm_readings, name, pairs, axes):
    """Text tokens (t = h = w = p) turn every pair as plain RoPE; each pair follows one axis."""
    reading = vllm_readings[name]
    _check(reading, ref.rope_frequencies(D, BASE), pairs=pairs)
    assert list(reading.layers[0].extra["pair_axes"]) == axes


@pytest.mark.slow
def test_mrope_pair_axes_match_posenc(vllm_readings):
    from posenc.encodings.rotary.mrope import mrope_pair_axes

    expected = mrope_pair_axes([2, 3, 3]).tolist()
    assert list(vllm_readings["mrope"].layers[0].extra["pair_axes"]) == expected


@pytest.mark.slow
def test_fope_clipped_pairs_are_not_rotations(vllm_readings):
    """FoPE (Hua et al. 2024) sets the clipped frequencies to zero: those pairs stay still.
    vLLM pads their cos and sin with 1: at every position, 0 included, they turn by pi/4 and
    grow by sqrt 2. With identity coefficients the kept pairs are plain RoPE."""
    reading = vllm_readings["fope"]
    assert reading.ran, reading.note
    layer = reading.layers[0]
    kept = ref.rope_frequencies(D, BASE)[:6]
    np.testing.assert_allclose(layer.angles[:, :6], _angles(kept), **TOL)
    np.testing.assert_allclose(layer.angles[:, 6:], math.pi / 4, **TOL)
    np.testing.assert_allclose(layer.scale, (6 + 2 * math.sqrt(2)) / 8, **TOL)  # pair mean
    assert "scale differs between pairs" in reading.note


@pytest.mark.slow
def test_llama4_vision_rope_is_the_patch_grid(vllm_readings):
    """Llama 4's vision rope: patch n of a G x G grid at (x, y) = (n % G, n // G) turns the
    first R/4 pairs by (x + 1) theta and the next R/4 by (y + 1) theta, theta from R = D / 2;
    the CLS token (last) does not turn."""
    reading = vllm_readings["llama4_vision"]
    grid = math.isqrt(PATCHES)
    theta = ref.rope_frequencies(D // 2, BASE)
    n = np.arange(PATCHES)
    expected = np.zeros((PATCHES + 1, D // 2))
    expected[:PATCHES] = np.concatenate(
        [_angles(theta, n % grid + 1), _angles(theta, n // grid + 1)], axis=1
    )
    assert reading.layers[0].pairs == "adjacent"
    wrapped = np.angle(np.exp(1j * (reading.layers[0].angles - expected)))
    np.testing.assert_allclose(wrapped, 0.0, atol=16 * EPS32)


@pytest.mark.slow
def test_dual_chunk_does_not_build_on_cpu(vllm_readings):
    """vLLM's DualChunkRotaryEmbedding puts its caches on the accelerator: on a CPU build it
    does not build, and the reading says so instead of guessing."""
    reading = vllm_readings["dual_chunk"]
    assert not reading.ran and "accelerator" in reading.note


def test_missing_environment_is_a_note(tmp_path):
    reading = read_vllm(CONFIGS["default"], POSITIONS, context=CONTEXT, python=tmp_path / "none")
    assert not reading.ran and "setup_vllm.sh" in reading.note
    np.testing.assert_array_equal(reading.positions, POSITIONS)


@pytest.mark.parametrize(
    ("config", "positions", "context", "match"),
    [
        ({"model_type": "llama"}, POSITIONS, CONTEXT, "architectures"),
        (CONFIGS["default"], np.array([0.5, 1.0]), CONTEXT, "positions"),
        (CONFIGS["default"], np.array([-1, 2]), CONTEXT, "positions"),
        (CONFIGS["default"], POSITIONS, 0, "context"),
    ],
)
def test_bad_input_raises(config, positions, context, match):
    with pytest.raises(ValueError, match=match):
        read_vllm(config, positions, context=context, python="unused")


def _table(theta: np.ndarray, *, computed: int | None = None):
    from posenc.audit.reading import LayerPositions, Reading

    angles = _angles(theta)
    scale = np.full(len(POSITIONS), 1.25)
    if computed is not None:  # positions from `computed` on: not run (vLLM past its cache)
        past = np.asarray(POSITIONS) >= computed
        angles[past] = np.nan
        scale[past] = np.nan
    layer = LayerPositions(True, D, D, "half", angles, scale)
    return Reading("vllm" if computed else "transformers", POSITIONS, CONTEXT, (layer,))


@pytest.mark.parametrize("factor", [1.0, 1.0 + 2.0**-10])
def test_comparer_skips_positions_a_runtime_does_not_compute(factor):
    """Rows past vLLM's cache are NaN: compared on the positions both compute, a difference
    there is still found."""
    from posenc.audit.compare import compare

    theta = ref.rope_frequencies(D, BASE)
    rows = {
        r.field: r
        for r in compare([_table(theta), _table(theta * factor, computed=1000)], [512]).rows
    }
    assert rows["frequencies"].agree == (factor == 1.0)
    assert rows["cos/sin factor"].agree and rows["cos/sin factor"].values["vllm"] == "1.25"
