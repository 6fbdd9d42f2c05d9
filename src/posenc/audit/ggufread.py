"""A GGUF file's positions as llama.cpp reads them (metadata and rope tensors, via ``gguf``).

Shapes: ``P`` positions, ``R`` rotary dims, ``L`` layers.

The keys are the ones llama.cpp's loader reads (``src/llama-model.cpp``,
``load_hparams``; names in ``gguf.Keys``), prefixed by ``general.architecture``; the
rules that turn them into angles are ``posenc.audit.llamacpp``. Sliding-window layers
come from ``attention.sliding_window_pattern``: a per-layer list of flags, or a period
``n`` (layer ``i`` slides when ``i % n < n - 1``, ``llama_hparams::set_swa_pattern``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from posenc.audit.llamacpp import LlamaCppRope, layer_positions, rope_layout
from posenc.audit.reading import Reading

__all__ = ["RUNTIME", "gguf_rope", "read_gguf"]

RUNTIME = "llama.cpp (GGUF)"

#: rope tensors llama.cpp reads (``rope_freqs`` for Llama 3; LongRoPE's two)
_TENSORS = {
    "rope_freqs.weight": "freq_factors",
    "rope_factors_long.weight": "factors_long",
    "rope_factors_short.weight": "factors_short",
}


def _open(path: str | Path) -> Any:
    import gguf

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no GGUF file at {path}")
    try:
        return gguf.GGUFReader(path)
    except (ValueError, OSError, IndexError) as err:  # gguf's own errors for a bad file
        raise ValueError(f"{path} is not a readable GGUF file: {err}") from None


def _value(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return None
    value = field.contents()
    return list(value) if isinstance(value, (list, tuple)) else value


def _tensor(reader: Any, name: str) -> np.ndarray | None:
    from gguf.quants import dequantize

    for tensor in reader.tensors:
        if tensor.name == name:
            return np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float64)
    return None


#: architectures whose loader fixes the sliding-window layers in code (src/llama-model.cpp,
#: ``load_hparams``): (period, base, frequency scale) of the sliding layers, whatever the
#: file says; ``None`` keeps the file's (or the full layers') value
_FIXED_SWA = {"gemma3": (6, 10000.0, 1.0)}
#: architectures whose loader reads the period key with a default (gpt-oss: 2)
_DEFAULT_SWA_PERIOD = {"gpt-oss": 2}


def _swa_layers(pattern: Any, n_layer: int) -> tuple[bool, ...]:
    if pattern is None:
        return ()
    if isinstance(pattern, list):
        if len(pattern) != n_layer:
            raise ValueError(
                f"sliding_window_pattern has {len(pattern)} flags for {n_layer} layers"
            )
        return tuple(bool(x) for x in pattern)
    n = int(pattern)
    return tuple(n == 0 or i % n < n - 1 for i in range(n_layer))


#: architectures whose loader reads ``rope.scaling.yarn_log_multiplier`` (DeepSeek-V2's
#: ``load_hparams`` in src/llama-model.cpp; other architectures ignore the key)
_LOG_MUL_ARCHS = ("deepseek2",)


def _log_mul(arch: str, get: Any) -> float:
    if arch not in _LOG_MUL_ARCHS:
        return 0.0
    # the converter writes 0.1 mscale_all_dim; the loader divides it back
    # ([TAG_DEEPSEEK2_YARN_LOG_MUL_FIX])
    return float(get("rope.scaling.yarn_log_multiplier", 0.0)) / 0.1


#: architectures whose graph sets its own softmax scale from the MLA key width
#: (src/models/deepseek2.cpp, ``kq_scale``)
_KQ_SCALE_ARCHS = ("deepseek2",)


def _kq_head_dim(arch: str, key_length: int, get: Any) -> int | None:
    """``hparams.n_embd_head_k_mla()`` (src/llama-hparams.cpp): ``attention.key_length_mla``
    when the GGUF has both ``_mla`` lengths (``is_mla``), else the key length."""
    if arch not in _KQ_SCALE_ARCHS:
        return None
    mla_k, mla_v = get("attention.key_length_mla"), get("attention.value_length_mla")
    return int(mla_k) if mla_k and mla_v else key_length


def gguf_rope(path: str | Path) -> tuple[LlamaCppRope, dict[str, Any]]:
    """The rotary hyperparameters llama.cpp loads from the GGUF at ``path``, and the raw
    fields read (key -> value; rope tensors by name, as lists).

    Raises:
        ValueError: not a GGUF file, an architecture llama.cpp's rope table lacks, or a
            field llama.cpp would refuse (odd ``rope.dimension_count``, ...).
    """
    reader = _open(path)
    arch = _value(reader, "general.architecture")
    if not isinstance(arch, str):
        raise ValueError(f"{path}: no general.architecture")
    rope_layout(arch)
    fields: dict[str, Any] = {"general.architecture": arch}

    def get(key: str, default: Any = None) -> Any:
        value = _value(reader, f"{arch}.{key}")
        if value is not None:
            fields[f"{arch}.{key}"] = value
        return default if value is None else value

    n_layer = int(get("block_count", 0))
    n_head = get("attention.head_count", 0)
    n_head = int(n_head[0] if isinstance(n_head, list) else n_head)
    n_embd = int(get("embedding_length", 0))
    if n_head <= 0 or n_layer <= 0:
        raise ValueError(f"{path}: {arch}.attention.head_count / block_count missing")
    head_dim = int(get("attention.key_length", n_embd // n_head))
    kq_head_dim = _kq_head_dim(arch, head_dim, get)
    if get("attention.kv_lora_rank") is not None:  # MLA: the rotated part is its own head
        head_dim = int(get("rope.dimension_count", head_dim))
    n_ctx_train = int(get("context_length", 0))
    factor = get("rope.scaling.factor")
    if factor is None:
        factor = get("rope.scale_linear", 0.0)
    tensors = {}
    for name, attr in _TENSORS.items():
        values = _tensor(reader, name)
        if values is not None:
            fields[name] = values.tolist()
            tensors[attr] = values
    window = get("attention.sliding_window")
    swa_base = get("rope.freq_base_swa")
    swa_dims = get("rope.dimension_count_swa")
    pattern = get("attention.sliding_window_pattern", _DEFAULT_SWA_PERIOD.get(arch))
    swa_scale = None
    if arch in _FIXED_SWA and window:
        pattern, swa_base, swa_scale = _FIXED_SWA[arch]
    rope = LlamaCppRope(
        architecture=arch,
        n_layer=n_layer,
        head_dim=head_dim,
        n_rot=int(get("rope.dimension_count", head_dim)),
        freq_base=float(get("rope.freq_base", 10000.0)),
        scaling_type=str(get("rope.scaling.type", "linear")),
        factor=float(factor),
        n_ctx_train=n_ctx_train,
        n_ctx_orig=int(get("rope.scaling.original_context_length", n_ctx_train)),
        attn_factor=float(get("rope.scaling.attn_factor", 1.0)),
        yarn_ext_factor=float(get("rope.scaling.yarn_ext_factor", -1.0)),
        yarn_attn_factor=float(get("rope.scaling.yarn_attn_factor", 1.0)),
        beta_fast=float(get("rope.scaling.yarn_beta_fast", 32.0)),
        beta_slow=float(get("rope.scaling.yarn_beta_slow", 1.0)),
        yarn_log_mul=_log_mul(arch, get),
        sections=tuple(int(x) for x in get("rope.dimension_sections", [])),
        sliding_window=None if window is None else int(window),
        swa_layers=_swa_layers(pattern, n_layer) if window else (),
        freq_base_swa=None if swa_base is None else float(swa_base),
        freq_scale_swa=swa_scale,
        n_rot_swa=None if swa_dims is None else int(swa_dims),
        alibi_max_bias=get("attention.max_alibi_bias"),
        kq_head_dim=kq_head_dim,
        **tensors,
    )
    return rope, fields


def read_gguf(path: str | Path, positions: Sequence[int] | np.ndarray, *, context: int) -> Reading:
    """The GGUF at ``path`` as llama.cpp runs it for a ``context``-token sequence: every
    layer's ``LayerPositions`` at ``positions`` (``[P]``)."""
    rope, fields = gguf_rope(path)
    note = None
    if rope.sliding_window and not rope.swa_layers:
        note = (
            "attention.sliding_window without sliding_window_pattern: llama.cpp takes the "
            f"pattern from its code for {rope.architecture}; every layer read as full"
        )
    layers = tuple(layer_positions(rope, i, positions, context) for i in range(rope.n_layer))
    return Reading(RUNTIME, np.asarray(positions), context, layers, fields, note)
