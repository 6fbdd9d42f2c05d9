"""Per-layer truth from the real models: every decoder family of the installed transformers.

For each ``model_type`` with a ``*ForCausalLM`` class whose modeling file rotates q/k with a
module-level function (``posenc.hf.patch_rotation.rotation_methods``), ``build`` makes a tiny
random model from the family's own config class (its defaults, shrunk: ``TINY`` and the
per-layer lists cut to the first layers that show every layer type). ``record`` runs it at
positions ``0..T-1`` and ``OFFSET + 0..T-1`` with each attention module's rotation
functions wrapped, so that for every layer it knows whether transformers rotated there and
with what. ``compare`` checks ``posenc.hf.layer_plan`` layer by layer against that record:
a layer that transformers leaves unrotated must be NoPE in posenc, and a rotated one must
give the same attention scores (the self inner products ``q_m . q_n`` of the rotated
tensors, which a feature permutation common to q and k does not change) to a tolerance from
float32 angles. ``layer_plan`` is read twice, from the ``PretrainedConfig`` and from the
``config.json`` that ``save_pretrained`` would write (only what differs from the defaults).
The rotation of a sparse-attention indexer (DeepSeek-V3.2, A.X K2: a top-k key selector
with its own half-split rotation beside the attention's interleaved one) is recorded apart
(``record(..., indexers=True)``): ``layer_plan`` gives the attention's encoding;
``check_patch`` covers both rotations.
Linear-attention layers run transformers' PyTorch path (``pytorch_fallbacks``).

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``W`` width of the rotated tensor.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import re
import sys
import warnings
from dataclasses import dataclass, field
from unittest import mock

import torch

import posenc
from posenc.encodings.rotary.apply import apply_rope
from posenc.hf.patch_rotation import TENSOR_ARGUMENTS, rebind, rotation_methods

T, OFFSET = 7, 1000
EPS32 = torch.finfo(torch.float32).eps
TINY = {
    "hidden_size": 64,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 128,
    "head_dim": 16,
    "moe_intermediate_size": 32,
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "q_lora_rank": 32,
    "kv_lora_rank": 16,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 16,
    # linear-attention heads (gated delta nets; 128-feature heads at full size)
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_head_dim": 16,
    "linear_num_heads": 4,
}
_BLT_STACK = {
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 1,
    "intermediate_size": 64,
    "head_dim": 16,
}
_BLT_LOCAL = {**_BLT_STACK, "hidden_size_global": 64}
# fields beyond TINY that a family needs to build tiny (its defaults assume full size)
FIELDS: dict[str, dict] = {
    "mimo_v2_flash": {"head_dim": 48},  # partial_rotary_factor 0.334: an even rotary dim
    # Llama 3.2 Vision: its default cross-attention layers (3, 8, ...) lie beyond two layers
    "mllama_text_model": {"cross_attention_layers": [1]},
    # Qwen 3.5-style M-RoPE: sections of 32 pairs, a quarter of a 256-feature head rotated
    **{name: {"head_dim": 256} for name in ("qwen3_5_text", "qwen3_5_moe_text")},
    # Mamba heads sized from the tiny hidden size (the defaults keep the full model's), and
    # an attention layer after a Mamba one
    "bamba": {"mamba_n_heads": 8, "mamba_d_head": 16, "attn_layer_indices": [1]},
    "granitemoehybrid": {
        "mamba_n_heads": 8,
        "mamba_d_head": 16,
        "layer_types": ["mamba", "attention"],
    },
    "zamba2": {"mamba_headdim": 16, "attention_hidden_size": 128, "attention_head_dim": 32},
    "zaya": {"num_experts_per_tok": 1},  # ZAYA routes each token to one expert
    # Dory's four layers (three sliding, one full) as blocks: one input, two looped, one output
    "dory": {"n_input_layers": 2, "n_recurrent_layers": 4, "n_output_layers": 2},
    "dots1": {"n_shared_experts": 1},
    "lfm2_moe": {"layer_types": ["conv", "full_attention"], "num_dense_layers": 1},
    # DBRX names its sizes d_model / n_heads and nests them; its attention module reads
    # rope_theta and clip_qkv from attn_config, where released configs set them (the
    # rotary module takes rope_parameters' base: posenc refuses the nested one by name)
    "dbrx": {
        "d_model": 64,
        "n_heads": 4,
        "ffn_config": {"ffn_hidden_size": 64, "moe_num_experts": 4, "moe_top_k": 2},
        "attn_config": {"rope_theta": 500000.0, "kv_n_heads": 2, "clip_qkv": 8.0},
    },
    # BLT: each stack's sub-config (the defaults build a 500k-row hash embedding)
    "blt": {
        "encoder_hash_byte_group_vocab": 64,
        "encoder_config": _BLT_LOCAL,
        "decoder_config": _BLT_LOCAL,
        "global_config": _BLT_STACK,
        "patcher_config": _BLT_STACK,
    },
    # Gemma 3n: no KV-sharing layers (their pattern needs all 35 layers); each layer type
    # still rotates as in the released model
    "gemma3n_text": {"num_kv_shared_layers": 0},
    # one group of the 4 tiny experts
    "bailing_hybrid": {"num_expert_group": 1, "topk_group": 1, "num_experts_per_token": 2},
    **{name: {"n_group": 1, "topk_group": 1} for name in ("axk1", "beam")},
    # sparse-attention MLA: as many key heads as query heads (the keys are expanded per head)
    **{
        name: {"n_group": 1, "topk_group": 1, "num_key_value_heads": 4}
        for name in ("axk2", "deepseek_v32", "glm_moe_dsa")
    },
    # GPT-J and CodeGen name their sizes n_embd / n_head / n_inner
    **{
        name: {"n_embd": 64, "n_head": 4, "n_inner": 64, "rotary_dim": 8}
        for name in ("gptj", "codegen")
    },
}
_LAYER = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks)\.(\d+)\.")


@functools.cache
def families() -> dict[str, str]:
    """``{model_type: causal-LM class name}`` of the decoder families that rotate q/k with a
    module-level function of their modeling file."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    found = {}
    for model_type, name in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items()):
        try:
            cls = getattr(transformers, name)
        except (AttributeError, ImportError, ModuleNotFoundError):
            continue
        if model_type in CONFIG_MAPPING and "text_config" in CONFIG_MAPPING[model_type].sub_configs:
            text = CONFIG_MAPPING[model_type].sub_configs["text_config"]
            if inspect.get_annotations(cls).get("config") is not text:
                continue  # a composite whose text model is its own family (Gemma 3 -> gemma3_text)
            model_type = text.model_type  # a causal LM of the text config (Llama 3.2 Vision)
        module = sys.modules[cls.__module__]
        classes = [c for c in vars(module).values() if isinstance(c, type)]
        if any(issubclass(c, torch.nn.Module) and rotation_methods(c) for c in classes):
            found[model_type] = name
    return found


def tiny_config(model_type: str):
    """The family's default text config, shrunk (module docstring)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    base = CONFIG_MAPPING[model_type]()
    text = base.get_text_config() if hasattr(base, "get_text_config") else base
    layers = getattr(text, "num_hidden_layers", 2) or 2
    kinds = getattr(text, "layer_types", None)
    count = min(layers, 2)
    for index, kind in enumerate(kinds or ()):
        if kind not in kinds[:index]:
            count = max(count, index + 1)
    values = text.to_dict()
    # Dory's dict lists each layer as two blocks (attention, "mlp") and counts them so
    blocks = 2 if len(values.get("layer_types") or ()) == 2 * layers else 1
    for key, value in list(values.items()):
        if isinstance(value, list) and len(value) == blocks * layers:
            values[key] = value[: blocks * count]  # per-layer lists: layer_types, ...
    values.update({k: v for k, v in TINY.items() if k in values})
    if "qk_rope_head_dim" in values:  # MLA: the rotated part of each head
        values["head_dim"] = values["qk_rope_head_dim"]
    if "qk_head_dim" in values:  # MLA models that keep the whole head's width as a field
        values["qk_head_dim"] = values["qk_rope_head_dim"] + values["qk_nope_head_dim"]
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if isinstance(values.get(key), int) and values[key] >= values.get("vocab_size", 1 << 30):
            values[key] = 0
    if isinstance(values.get("per_layer_config"), dict):  # Gemma 4, dots3: by layer index
        layer_keys = {k: v for k, v in values["per_layer_config"].items() if int(k) < count}
        values["per_layer_config"] = layer_keys
    values.update(FIELDS.get(model_type, {}))
    values["num_hidden_layers"] = blocks * count
    values.pop("transformers_version", None)
    return type(text).from_dict(values)


def build(model_type: str):
    """A tiny random float32 model of the family, in eval mode."""
    import transformers

    config = tiny_config(model_type)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.getLogger("transformers").setLevel(logging.ERROR)
        model = getattr(transformers, families()[model_type])(config)
    return model.float().eval()


@contextlib.contextmanager
def pytorch_fallbacks(model):
    """``model``'s modeling module with transformers' PyTorch paths for the kernels it takes
    from an optional package (flash-linear-attention's gated delta rule, causal-conv1d).

    transformers picks such a kernel when its modeling module is imported, if the package
    imports (``use_kernel_func_from_hub_with_fallback``); flash-linear-attention's are
    Triton kernels, which need a GPU. Inside the context each one is rebuilt by the same
    decorator with its package not importable, as transformers builds it without the
    package: the reference PyTorch function, called the same way.
    """
    from transformers.integrations import hub_kernels

    module = sys.modules[type(model).__module__]
    rebuilt = {}
    for name, value in vars(module).items():
        cells = _closure(value)
        if cells.get("is_new_implementation") is True:
            package = cells["package"]
            with mock.patch.dict(sys.modules, {package: None}):  # import fails: the fallback
                decorate = hub_kernels.use_kernel_func_from_hub_with_fallback
                rebuilt[name] = decorate(cells["func_name"], package)(cells["torch_function"])
    saved = {name: vars(module)[name] for name in rebuilt}
    vars(module).update(rebuilt)
    try:
        yield
    finally:
        vars(module).update(saved)


def _closure(function) -> dict:
    """The free variables of ``function`` by name (empty for anything else)."""
    code, cells = getattr(function, "__code__", None), getattr(function, "__closure__", None)
    if code is None or not cells:
        return {}
    values = {}
    for name, cell in zip(code.co_freevars, cells, strict=True):
        with contextlib.suppress(ValueError):  # an empty cell
            values[name] = cell.cell_contents
    return values


@dataclass
class Call:
    """One call of a rotation function: its tensors before and after, and the heads axis."""

    inputs: list[torch.Tensor]
    outputs: list[torch.Tensor]
    heads_axis: int


@dataclass
class Record:
    """The calls per layer index at one set of positions."""

    positions: torch.Tensor
    layers: dict[int, list[Call]] = field(default_factory=dict)


def _recorder(real, layer: int, record: Record):
    signature = inspect.signature(real)

    def recording(*args, **kwargs):
        out = real(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        values = bound.arguments
        names = [n for n in values if n in TENSOR_ARGUMENTS]
        inputs = [values[n] for n in names if values[n] is not None]
        outputs = list(out) if isinstance(out, tuple) else [out]
        axis = values.get("unsqueeze_dim")
        if axis is None:
            axis = 1 if inputs[0].shape[1] != T or inputs[0].shape[2] == T else 2
        call = Call([x.detach().double() for x in inputs], [], axis)
        call.outputs = [y.detach().double() for y in outputs[: len(inputs)]]
        record.layers.setdefault(layer, []).append(call)
        return out

    return recording


def record(model, first: int, *, indexers: bool = False) -> Record:
    """Run ``model`` at positions ``first + 0..T-1`` and record every rotation call of its
    attention modules (``indexers``: of its sparse-attention indexers instead)."""
    rec = Record(torch.arange(first, first + T))
    installed = []
    for name, module in model.named_modules():
        methods = rotation_methods(type(module))
        found = _LAYER.search(name)
        if not methods or not found or name.endswith(".indexer") != indexers:
            continue
        layer = int(found[1])
        for method, names in methods.items():
            function = getattr(type(module), method)
            globals_ = inspect.unwrap(function).__globals__
            swaps = {n: _recorder(globals_[n], layer, rec) for n in names}
            bound = rebind(function, swaps).__get__(module)
            module.__dict__[method] = bound
            installed.append((module, method))
    ids = (torch.arange(T) * 5 + 3)[None] % 100
    try:
        with torch.no_grad():
            model(input_ids=ids, position_ids=rec.positions[None], use_cache=False)
    finally:
        for module, method in installed:
            module.__dict__.pop(method, None)
    return rec


def _rotary(encoding):
    """The ``RotaryEmbedding`` of a layer's encoding, None for NoPE layers; an M-RoPE
    layer's own (the walk's text positions are equal on every axis)."""
    if isinstance(encoding, posenc.RotaryEmbedding):
        return encoding
    if isinstance(encoding, posenc.MRoPE):
        return encoding.rope
    parts = getattr(encoding, "encodings", None) or getattr(encoding, "parts", None) or ()
    return next((p for p in parts if isinstance(p, posenc.RotaryEmbedding)), None)


def _rotated(encoding, x: torch.Tensor, axis: int, positions: torch.Tensor) -> torch.Tensor:
    """posenc's rotation of ``x`` (heads at ``axis``), width its own head or rotary dim."""
    x = x.transpose(1, 2) if axis == 2 else x
    if x.shape[-1] == encoding.head_dim:
        out, _ = encoding.rotate(x, x, positions, positions)
    else:
        cos, sin = encoding.cos_sin(positions, dtype=torch.float64)
        if x.shape[-1] != 2 * cos.shape[-1]:
            raise ValueError(f"width {x.shape[-1]} is neither head_dim nor the rotary dim")
        sin = -sin if encoding.clockwise else sin
        out = apply_rope(x, cos, sin, interleaved=encoding.interleaved)
    return out


def _scores(x: torch.Tensor) -> torch.Tensor:
    return x @ x.transpose(-1, -2)  # [B, H, T, T]


def compare(plan: list, rec: Record) -> list[str]:
    """Where ``plan`` (``layer_plan``) differs from the record, one line per layer."""
    problems = []
    for index, encoding in enumerate(plan):
        calls = rec.layers.get(index, [])
        rotary = _rotary(encoding)
        if rotary is None:
            if calls:
                problems.append(f"layer {index}: transformers rotates, posenc has none")
            continue
        if not calls:
            problems.append(f"layer {index}: posenc rotates, transformers does not")
            continue
        for call in calls:
            for x, y in zip(call.inputs, call.outputs, strict=True):
                try:
                    ours = _rotated(rotary, x, call.heads_axis, rec.positions)
                except ValueError as exc:
                    problems.append(f"layer {index}: {exc}")
                    continue
                theirs = y.transpose(1, 2) if call.heads_axis == 2 else y
                want, got = _scores(theirs), _scores(ours)
                tol = 32 * (int(rec.positions.max()) + T) * EPS32 * float(want.abs().max())
                error = float((got - want).abs().max())
                if not error <= tol:
                    problems.append(
                        f"layer {index} at {int(rec.positions[0])}: scores differ by "
                        f"{error:.3g} (tolerance {tol:.3g})"
                    )
    return problems


class Refused(Exception):
    """posenc refuses the family's config by name (never a wrong encoding)."""


def check_family(model_type: str, model=None) -> list[str]:
    """Every difference between posenc's layer plans (from the config object and from its
    ``config.json``) and the tiny model's rotations; an empty list is a match.

    Raises:
        Refused: ``layer_plan`` raises ``ValueError`` on the config (its message).
    """
    model = build(model_type) if model is None else model
    config = model.config
    raw = config.to_diff_dict()
    problems = []
    records = [record(model, 0), record(model, OFFSET)]
    for source, cfg in (("config", config), ("config.json", raw)):
        try:
            plan = posenc.hf.layer_plan(cfg)
        except ValueError as exc:
            raise Refused(str(exc)) from exc
        for rec in records:
            problems += [f"{source}: {p}" for p in compare(plan, rec)]
    return problems


def check_patch(model_type: str, model=None) -> list[str]:
    """Where ``posenc.hf.patch`` of the tiny model differs from it: logits of a forward,
    greedy tokens and their logits, and the model after ``unpatch``.

    Raises:
        Refused: ``patch`` raises ``ValueError`` (its message).
    """
    model = build(model_type) if model is None else model
    ids = (torch.arange(2 * T) * 5 + 3)[None] % 100
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        tokens = model.generate(ids[:, :T], max_new_tokens=T, do_sample=False, pad_token_id=0)
    try:
        posenc.hf.patch(model)
    except ValueError as exc:
        raise Refused(str(exc)) from exc
    problems = []
    with torch.no_grad():
        got = model(input_ids=ids).logits
        patched = model.generate(ids[:, :T], max_new_tokens=T, do_sample=False, pad_token_id=0)
    tol = 16 * (2 * T + len(_rotating_modules(model))) * EPS32 * float(expected.abs().max())
    if not float((got - expected).abs().max()) <= tol:
        problems.append(f"logits differ by {float((got - expected).abs().max()):.3g}")
    if not torch.equal(patched, tokens):
        problems.append("greedy tokens differ")
    posenc.hf.unpatch(model)
    with torch.no_grad():
        if not torch.equal(model(input_ids=ids).logits, expected):
            problems.append("unpatch does not restore the model")
    return problems


def _rotating_modules(model) -> list:
    """The decoder layers' attention modules that call a rotation function."""
    return [m for m in model.modules() if rotation_methods(type(m))]
