"""llama.cpp's rotary rules, as its source states them: GGUF metadata to per-layer angles.

Shapes: ``P`` positions, ``R`` rotary dims (``n_rot``), ``L`` layers.

Every rule here is read from llama.cpp's repository (ggml-org/llama.cpp), file by file:

* ``src/llama-model.cpp``, ``llama_model_rope_type``: the pair layout by architecture —
  ``LLAMA_ROPE_TYPE_NORM`` rotates adjacent pairs ``(2j, 2j + 1)``, ``NEOX`` pairs offset by
  ``n_rot / 2``, ``MROPE`` / ``IMROPE`` (Qwen2-VL, Qwen3-VL) are NeoX-style M-RoPE whose
  ``rope.dimension_sections`` split the pairs between position axes (equal for text), and
  ``NONE`` does not rotate (``ARCHITECTURES`` below);
* ``llama_model_base::load_hparams`` (same file): ``rope.freq_base`` (default 10000),
  ``rope.scaling.type`` (default ``"linear"``), ``rope.scaling.factor`` (or the old
  ``rope.scale_linear``; 0 means none) as ``freq_scale = 1 / factor``,
  ``rope.scaling.original_context_length`` (default ``context_length``),
  ``rope.scaling.attn_factor`` (default 1), ``rope.dimension_count`` (default the key
  length, itself ``embedding_length / head_count`` unless ``attention.key_length``); the
  sliding-window layers take the same scaling and ``rope.freq_base_swa`` when written,
  except where an architecture's loader fixes them (Gemma 3: every 6th layer full, the
  others base 10000 and no scaling, whatever the file says);
* ``src/llama-context.cpp`` (context set-up): a ``"none"`` scaling forces
  ``freq_scale = 1``; ``yarn_ext_factor`` unset (negative) is 1 for YaRN, else 0; with an
  extrapolation factor the attention factor is set to ``get_mscale(factor, mscale) /
  get_mscale(factor, mscale_all_dims)`` (``mscale_all_dims = yarn_log_multiplier``; 1 when
  it is 0; DeepSeek-V2 also takes ``mscale = mscale_all_dims``) divided by
  ``1 + 0.1 ln(factor)``, which ``ggml`` multiplies back, then times ``rope.scaling.attn_factor``;
* ``src/models/deepseek2.cpp``: the graph's softmax scale ``kq_scale`` puts the YaRN
  magnitude back on ``q . k`` (``_kq_scale``), with ``n_embd_head_k_mla``
  (``attention.key_length_mla`` when the GGUF has both ``_mla`` lengths, else the key length);
* ``src/llama-model.cpp``, ``get_rope_factors``: the ``rope_freqs`` tensor when present
  (Llama 3's scaling), else LongRoPE's ``rope_factors_long`` when the context is longer
  than the original one, else ``rope_factors_short``;
* ``ggml/src/ggml-cpu/ops.cpp``, ``rope_yarn`` / ``rope_yarn_ramp`` and ``ggml.c``,
  ``ggml_rope_yarn_corr_dims``: for pair ``j`` with ``theta_extrap = p base^(-2j/R) / ff_j``,
  ``theta = freq_scale theta_extrap (1 - mix) + theta_extrap mix`` with ``mix = ext_factor
  (1 - clamp((j - low) / max(0.001, high - low), 0, 1))``, ``low = max(0, floor(c(beta_fast)))``,
  ``high = min(R - 1, ceil(c(beta_slow)))``, ``c(b) = R ln(n_ctx_orig / (2 pi b)) / (2 ln base)``;
  cos and sin are multiplied by ``attn_factor (1 + 0.1 ln(1 / freq_scale))`` when
  ``ext_factor != 0``, by ``attn_factor`` otherwise (YaRN: Peng et al., 2023, eqs. 17-22).

llama.cpp computes these in float32; here they are evaluated in float64 from the same
parameters, so two readings compare parameters, not rounding.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from posenc.audit.reading import LayerPositions, no_rotation

__all__ = ["ARCHITECTURES", "LlamaCppRope", "layer_positions", "rope_layout"]

_NONE = (
    "clip gpt2 gptj mpt refact bloom mamba mamba2 jamba jina-bert-v2 t5 t5encoder jais "
    "rwkv6 rwkv6qwen2 rwkv7 arwkv7 nemotron_h nemotron_h_moe kimi-linear wavtokenizer-dec"
)
_NORM = (
    "llama llada llama4 deci baichuan starcoder internlm2 minicpm xverse command-r cohere2 "
    "olmo arctic deepseek deepseek2 plm chatglm granite granitemoe granitehybrid chameleon "
    "bailingmoe smollm3 arcee ernie4_5 ernie4_5-moe mistral3 deepseek2-ocr mistral4 llama-embed "
    "maincoder glm-dsa neo-bert"
)
_NEOX = (
    "falcon falcon-h1 grok dbrx bert modern-bert nomic-bert nomic-bert-moe stablelm bitnet "
    "qwen qwen2 dream qwen2moe qwen3 qwen3moe llada-moe olmo2 olmoe phi2 phi3 phimoe plamo "
    "plamo2 gemma gemma2 gemma3 gemma3n starcoder2 openelm gptneox codeshell orion nemotron "
    "exaone exaone4 minicpm3 bailingmoe2 dots1 hunyuan-moe gpt-oss hunyuan-dense lfm2 "
    "smallthinker seed_oss apertus minimax-m2 qwen3next eurobert jina-bert-v3 exaone-moe "
    "gemma-embedding gemma4 plamo3 rnd1 lfm2moe grovemoe cogvlm pangu-embedded afmoe mimo2 step35 "
    "jais2"
)

#: GGUF ``general.architecture`` -> llama.cpp's rope type (``llama_model_rope_type``).
ARCHITECTURES: dict[str, str] = {
    **dict.fromkeys(_NONE.split(), "none"),
    **dict.fromkeys(_NORM.split(), "norm"),
    **dict.fromkeys(_NEOX.split(), "neox"),
    **dict.fromkeys(("qwen2vl", "paddleocr"), "mrope"),
    **dict.fromkeys(("qwen3vl", "qwen3vlmoe", "qwen35", "qwen35moe"), "imrope"),
}

_PAIRS = {"norm": "adjacent", "neox": "half", "mrope": "half", "imrope": "half", "none": "none"}
_SCALING_TYPES = ("none", "linear", "yarn", "longrope")


def rope_layout(architecture: str) -> str:
    """llama.cpp's rope type for ``architecture``: ``"norm"``, ``"neox"``, ``"mrope"``,
    ``"imrope"`` or ``"none"``; an architecture it does not list raises ``ValueError``."""
    try:
        return ARCHITECTURES[architecture]
    except KeyError:
        raise ValueError(
            f"GGUF architecture {architecture!r} is not in posenc's copy of llama.cpp's "
            "llama_model_rope_type"
        ) from None


@dataclass(frozen=True)
class LlamaCppRope:
    """The rotary hyperparameters llama.cpp loads from a GGUF (its defaults filled in).

    ``freq_factors`` / ``factors_long`` / ``factors_short`` are the ``[R/2]`` tensors
    ``rope_freqs``, ``rope_factors_long``, ``rope_factors_short`` (None when absent).
    ``swa_layers[i]`` marks a sliding-window layer (empty: none). ``kq_head_dim`` is
    ``n_embd_head_k_mla`` of an architecture whose graph sets its own ``kq_scale`` from it
    (deepseek2; None: ``1 / sqrt(head_dim)``).
    """

    architecture: str
    n_layer: int
    head_dim: int
    n_rot: int
    freq_base: float
    scaling_type: str = "linear"
    factor: float = 0.0
    n_ctx_train: int = 0
    n_ctx_orig: int = 0
    attn_factor: float = 1.0
    yarn_ext_factor: float = -1.0
    yarn_attn_factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    yarn_log_mul: float = 0.0
    freq_factors: np.ndarray | None = None
    factors_long: np.ndarray | None = None
    factors_short: np.ndarray | None = None
    sections: tuple[int, ...] = ()
    sliding_window: int | None = None
    swa_layers: tuple[bool, ...] = ()
    freq_base_swa: float | None = None
    freq_scale_swa: float | None = None
    n_rot_swa: int | None = None
    alibi_max_bias: float | None = None
    kq_head_dim: int | None = None

    def __post_init__(self) -> None:
        if self.scaling_type not in _SCALING_TYPES:
            raise ValueError(
                f"rope.scaling.type {self.scaling_type!r} is not one llama.cpp knows "
                f"{_SCALING_TYPES}"
            )
        if self.n_rot % 2 or not 0 <= self.n_rot <= self.head_dim:
            raise ValueError(
                f"rope.dimension_count {self.n_rot} must be even and at most the key length "
                f"{self.head_dim}"
            )
        if self.freq_base <= 0:
            raise ValueError(f"rope.freq_base must be > 0, got {self.freq_base}")


def _mscale(scale: float, mscale: float) -> float:
    return 1.0 if scale <= 1.0 else 0.1 * mscale * math.log(scale) + 1.0


def _freq_scale(rope: LlamaCppRope) -> float:
    if rope.scaling_type == "none" or rope.factor == 0.0:
        return 1.0
    return 1.0 / rope.factor


def _ext_factor(rope: LlamaCppRope) -> float:
    if rope.yarn_ext_factor >= 0.0:
        return rope.yarn_ext_factor
    return 1.0 if rope.scaling_type == "yarn" else 0.0


def _graph_attn_factor(rope: LlamaCppRope, ext_factor: float, freq_scale: float) -> float:
    """``cparams.yarn_attn_factor``, the ``attn_factor`` a graph hands ``ggml_rope_ext``
    (llama-context.cpp)."""
    attn = rope.yarn_attn_factor
    if ext_factor != 0.0:
        factor = 1.0 / freq_scale
        if rope.yarn_log_mul != 0.0:
            mscale_all = rope.yarn_log_mul
            mscale = mscale_all if rope.architecture == "deepseek2" and mscale_all != 1.0 else 1.0
            attn = _mscale(factor, mscale) / _mscale(factor, mscale_all)
        else:
            attn = _mscale(factor, 1.0)
        attn /= 1.0 + 0.1 * math.log(factor)
    return attn * rope.attn_factor


def _attn_factor(rope: LlamaCppRope, ext_factor: float, freq_scale: float) -> float:
    """The cos/sin multiplier ``ggml`` ends with (llama-context.cpp, then ``rope_yarn``)."""
    attn = _graph_attn_factor(rope, ext_factor, freq_scale)
    if ext_factor != 0.0:
        attn *= 1.0 + 0.1 * math.log(1.0 / freq_scale)  # rope_yarn's own magnitude factor
    return attn


def _kq_scale(rope: LlamaCppRope, ext_factor: float, freq_scale: float) -> float | None:
    """The deepseek2 graph's ``kq_scale`` (src/models/deepseek2.cpp): ``attn_factor_org =
    attn_factor (1 + 0.1 ln(1/freq_scale))``, ``mscale = attn_factor_org (1 + 0.1
    rope_yarn_log_mul ln(1/freq_scale))``, ``kq_scale = mscale^2 / sqrt(n_embd_head_k_mla)``;
    None for an architecture whose graph keeps ``1 / sqrt(head_dim)``."""
    if rope.kq_head_dim is None:
        return None
    log_inv = math.log(1.0 / freq_scale)
    org = _graph_attn_factor(rope, ext_factor, freq_scale) * (1.0 + 0.1 * log_inv)
    mscale = org * (1.0 + 0.1 * rope.yarn_log_mul * log_inv)
    return mscale * mscale / math.sqrt(rope.kq_head_dim)


def _corr_dims(n_dims: int, n_ctx_orig: int, base: float, fast: float, slow: float):
    def dim(n_rot: float) -> float:
        return n_dims * math.log(n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))

    return max(0.0, math.floor(dim(fast))), min(n_dims - 1.0, math.ceil(dim(slow)))


def _factors(rope: LlamaCppRope, context: int, pairs: int) -> np.ndarray:
    if rope.freq_factors is not None:
        chosen = rope.freq_factors
    elif rope.factors_long is not None and context > rope.n_ctx_orig:
        chosen = rope.factors_long
    elif rope.factors_short is not None:
        chosen = rope.factors_short
    else:
        return np.ones(pairs)
    chosen = np.asarray(chosen, dtype=np.float64).reshape(-1)
    if chosen.shape != (pairs,):
        raise ValueError(f"rope factor tensor has {chosen.size} entries for n_rot/2 = {pairs}")
    return chosen


def layer_positions(
    rope: LlamaCppRope, index: int, positions: Sequence[int] | np.ndarray, context: int
) -> LayerPositions:
    """Layer ``index``'s positions as llama.cpp computes them, for a ``context``-token run.

    Returns a ``LayerPositions`` with ``[P, R/2]`` angles (float64, from llama.cpp's
    parameters) and the ``[P]`` cos/sin factor.
    """
    pos = np.asarray(positions, dtype=np.float64)
    layout = rope_layout(rope.architecture)
    swa = bool(rope.swa_layers and rope.swa_layers[index])
    window = rope.sliding_window if swa else None
    if layout == "none" or rope.n_rot == 0:
        return no_rotation(
            rope.head_dim, len(pos), sliding_window=window, alibi_max_bias=rope.alibi_max_bias
        )
    base = rope.freq_base_swa if swa and rope.freq_base_swa else rope.freq_base
    n_rot = rope.n_rot_swa if swa and rope.n_rot_swa else rope.n_rot
    freq_scale = _freq_scale(rope)
    if swa and rope.freq_scale_swa is not None:
        freq_scale = rope.freq_scale_swa
    ext = _ext_factor(rope)
    j = np.arange(n_rot // 2, dtype=np.float64)
    extrap = base ** (-2.0 * j / n_rot) / _factors(rope, context, n_rot // 2)  # [R/2]
    theta = freq_scale * extrap
    if ext != 0.0:
        low, high = _corr_dims(n_rot, rope.n_ctx_orig, base, rope.beta_fast, rope.beta_slow)
        ramp = 1.0 - np.clip((j - low) / max(0.001, high - low), 0.0, 1.0)
        mix = ramp * ext
        theta = theta * (1 - mix) + extrap * mix
    extra = {}
    if layout in ("mrope", "imrope"):
        extra = {"sections": list(rope.sections), "mrope_interleaved": layout == "imrope"}
    return LayerPositions(
        rotates=True,
        head_dim=rope.head_dim,
        rotary_dim=n_rot,
        pairs=_PAIRS[layout],
        angles=pos[:, None] * theta[None, :],  # [P, R/2]
        scale=np.full(len(pos), _attn_factor(rope, ext, freq_scale)),
        softmax_scale=_kq_scale(rope, ext, freq_scale),
        sliding_window=window,
        alibi_max_bias=rope.alibi_max_bias,
        extra=extra,
    )
