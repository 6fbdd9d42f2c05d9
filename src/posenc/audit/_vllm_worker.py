"""Worker run inside vLLM's own environment: vLLM's rotary modules probed for their angles.

Shapes: ``P`` probed positions, ``D`` head_size, ``R`` rotary_dim, ``H`` heads.

Run as ``python _vllm_worker.py`` with a JSON request on stdin; writes one JSON list of
``posenc.audit.reading.Reading`` dicts on stdout. It imports torch and vLLM only (nothing of
posenc), so it runs in an environment that has vLLM and not posenc. Two kinds of job:

* ``{"config": {...}, "max_model_len": N}``: a ``config.json`` served with ``--max-model-len
  N`` (default: the context). vLLM reads it (``ModelConfig``) and builds the
  architecture's own model class with dummy weights inside its config context, one process
  rank; each decoder layer's ``rotary_emb`` is then whatever that model file passed to
  ``get_rope`` (head size, rotary dim, NeoX or GPT-J style, rope parameters, dual chunk),
  and the layer's ``Attention`` gives its softmax scale and sliding window.
* ``{"get_rope": {...}, "source": "models/x.py"}``: ``get_rope`` called with the keyword
  arguments that model file passes (for a part not built as a decoder here, such as a
  vision tower), inside ``set_current_vllm_config(VllmConfig())``; with ``"rope_class"``,
  that rotary class built with them (a model file that builds its class itself).

Each rotary module is probed, never reimplemented: ``forward_native(positions, q, k)`` on
``q = k = I_D`` (one head per basis vector) gives the rotation ``M_p [D, D]`` vLLM applies
at position ``p``. Its nonzero off-diagonal entries give the pairs (half split ``(j, j+R/2)``
or adjacent ``(2j, 2j+1)``); pair ``j``'s first column is ``s_p (cos a, sin a)``, so the angle
``a_pj`` and the cos/sin scale ``s_p`` (YaRN's mscale, Peng et al. 2023, eq. 22) come back.
Angles are unwrapped against positions 0 and 1 (``a_0j + p (a_1j - a_0j)`` up to whole
turns), so the table is ``p * theta_j`` as vLLM computes it in float32. A position past the
module's cache is not run (vLLM indexes out of range there): its row is NaN, and the note
says so.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import re
import socket
import sys
import tempfile
import traceback
from typing import Any

# Run as a script, Python puts this folder first on sys.path, where posenc's own vllm.py
# would shadow the vllm package: drop it before anything imports vllm.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import torch  # noqa: E402

AXES_PROBE = 1  # the position each M-RoPE axis is probed at alone
MARKER = "posenc-vllm-readings: "  # starts the result line (vLLM logs to stdout too)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rotations(
    call: Any, positions: torch.Tensor, head_size: int, *, split_heads: bool = False
) -> torch.Tensor:
    """``[P, D, D]``: ``M_p`` with column ``i`` the image of basis vector ``e_i``.

    ``split_heads``: pass ``[P, H, D]`` (as DeepSeek's MLA passes its rope part), not
    ``[P, H*D]``.
    """
    n = positions.shape[-1]
    eye = torch.eye(head_size, dtype=torch.float32).reshape(1, head_size * head_size)
    q = eye.repeat(n, 1)  # [P, H=D heads * D]
    if split_heads:
        q = q.reshape(n, head_size, head_size)  # [P, H, D]
    out, _ = call(positions, q, q.clone())
    return out.reshape(n, head_size, head_size).transpose(1, 2).double()  # [P, out, in]


def _pairs(m: torch.Tensor) -> tuple[str, list[int], list[int]]:
    """The pair layout, each pair's first dim and its partner, from ``M`` at all positions."""
    d = m.shape[-1]
    off = (m - torch.eye(d, dtype=m.dtype)).abs().amax(dim=0)  # [out, in]
    off.fill_diagonal_(0.0)
    moved = [i for i in range(d) if off[:, i].max() > 1e-6]
    if not moved:
        return "none", [], []
    rot = len(moved)
    if moved != list(range(rot)) or rot % 2:
        raise ValueError(f"vLLM rotates dims {moved}, not a leading even block")
    partner = [int(off[:, i].argmax()) for i in range(rot)]
    half = rot // 2
    if all(partner[j] == j + half and partner[j + half] == j for j in range(half)):
        return "half", list(range(half)), list(range(half, rot))
    if all(partner[2 * j] == 2 * j + 1 for j in range(half)):
        return "adjacent", list(range(0, rot, 2)), list(range(1, rot, 2))
    raise ValueError(f"vLLM's rotation pairs dims as {partner}, neither half split nor adjacent")


def _unrotated(head_size: int, n: int) -> dict[str, Any]:
    return dict(
        rotates=False,
        head_dim=head_size,
        rotary_dim=0,
        pairs="none",
        angles=[[] for _ in range(n)],
        scale=[1.0] * n,
    )


def _layer(
    m: torch.Tensor, positions: list[int], head_size: int, unwrap: bool
) -> tuple[dict[str, Any], bool]:
    """``LayerPositions`` dict from ``M`` at [0, 1, *positions]; whether the scale varies by pair.

    Unwrapped, angle ``a_p`` is the one within half a turn of ``a_0 + p (a_1 - a_0)``.
    """
    pairs, first, second = _pairs(m)
    n = len(positions)
    if pairs == "none":
        return _unrotated(head_size, n), False
    idx_f, idx_s = torch.tensor(first), torch.tensor(second)
    cos = m[:, idx_f, idx_f]  # [2 + P, R/2]: s cos(a) of each pair
    sin = m[:, idx_s, idx_f]  # s sin(a)
    wrapped = torch.atan2(sin, cos)
    scale = torch.hypot(cos, sin)
    angles, scale = wrapped[2:], scale[2:]
    if unwrap:
        pos = torch.tensor(positions, dtype=torch.float64)[:, None]
        guess = wrapped[0] + pos * (wrapped[1] - wrapped[0])
        angles = angles + 2 * math.pi * torch.round((guess - angles) / (2 * math.pi))
    per_pair = bool((scale - scale.mean(-1, keepdim=True)).abs().max() > 1e-6)
    layer = dict(
        rotates=True,
        head_dim=head_size,
        rotary_dim=2 * len(first),
        pairs=pairs,
        angles=angles.tolist(),
        scale=scale.mean(-1).tolist(),
    )
    return layer, per_pair


def _cache_rows(rope: Any) -> int | None:
    for name in ("cos_sin_cache", "long_short_cos_sin_cache", "cos_sin_k_cache"):
        cache = getattr(rope, name, None)
        if isinstance(cache, torch.Tensor):
            return int(cache.shape[0])
    return None


def _probe(rope: Any, positions: list[int]) -> tuple[dict[str, Any], list[str]]:
    """One rotary module's layer dict and notes."""
    name = type(rope).__name__
    head_size = rope.head_size
    notes: list[str] = []
    if name == "Llama4VisionRotaryEmbedding":  # positions are the patch grid (+ CLS), implicit
        rows = _cache_rows(rope)
        eye = torch.eye(head_size).reshape(1, 1, head_size, head_size).repeat(1, rows, 1, 1)
        out, _ = rope.forward_native(eye, eye.clone())  # [1, N, H=D, D]
        m = out[0].transpose(1, 2).double()
        m = torch.cat([m[:2], m[positions]])  # the first rows only feed the pair search
        layer, per_pair = _layer(m, positions, head_size, unwrap=False)
        return layer, [f"{name}: positions are patch indices (row major, CLS last)"]
    rows = _cache_rows(rope)
    run = [p for p in positions if rows is None or p < rows]
    if len(run) < len(positions):
        notes.append(f"{name}: positions >= {rows} (its cache) are not computed by vLLM (NaN)")
    batch = [0, 1, *run]
    mrope = "MRotary" in name or "Ernie4_5_VL" in name or "Bailing" in name
    pos = torch.tensor(batch, dtype=torch.long)
    if mrope:
        pos = pos[None, :].repeat(3, 1)
    call = rope if name.startswith("Phi3LongRoPE") else rope.forward_native
    m = _rotations(call, pos, head_size, split_heads=name.startswith("Deepseek"))
    layer, per_pair = _layer(m, run, head_size, unwrap=True)
    if per_pair:
        notes.append(f"{name}: the cos/sin scale differs between pairs; the mean is shown")
    if len(run) < len(positions):
        keep = {p: i for i, p in enumerate(run)}
        nan = [math.nan] * (layer["rotary_dim"] // 2)
        layer["angles"] = [layer["angles"][keep[p]] if p in keep else nan for p in positions]
        layer["scale"] = [layer["scale"][keep[p]] if p in keep else math.nan for p in positions]
    if mrope:
        layer["extra"] = {"pair_axes": _pair_axes(rope, head_size, layer["pairs"])}
    return layer, notes


def _pair_axes(rope: Any, head_size: int, pairs: str) -> list[int]:
    """Which of the three M-RoPE axes (t, h, w) turns each pair (-1: none)."""
    turned = []
    for axis in range(3):
        pos = torch.zeros(3, 2, dtype=torch.long)
        pos[axis] = AXES_PROBE
        m = _rotations(rope.forward_native, pos, head_size)[1]
        turned.append((m - torch.eye(head_size, dtype=m.dtype)).abs())  # [out, in]
    first = range(rope.rotary_dim // 2) if pairs == "half" else range(0, rope.rotary_dim, 2)
    axes = []
    for i in first:
        hits = [a for a in range(3) if turned[a][:, i].max() > 1e-6]
        axes.append(hits[0] if len(hits) == 1 else -1)
    return axes


#: sizes that do not reach positions, cut so that a released model builds in seconds with
#: dummy weights (a Llama 3 8B in float32 would take 32 GB): widths, vocabulary, experts
_SMALL = {
    "vocab_size": 256,
    "intermediate_size": 32,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "n_routed_experts": 4,
    "num_experts": 4,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "n_group": 1,
    "topk_group": 1,
}


def shrunk(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with the sizes of ``_SMALL`` cut (text config too) and two query heads.

    The head width, the rotary fields, the layers and their types stay: the head dim is
    written out (``head_dim``, unless an MLA config names its rope head) before
    ``hidden_size`` becomes two heads wide.
    """
    out = dict(config)
    if isinstance(out.get("text_config"), dict):
        out["text_config"] = shrunk(out["text_config"])
    for key, small in _SMALL.items():
        if isinstance(out.get(key), int) and out[key] > small:
            out[key] = small
    heads, kv = out.get("num_attention_heads"), out.get("num_key_value_heads")
    if isinstance(heads, int) and heads > 2 and isinstance(out.get("hidden_size"), int):
        head_dim = out.get("head_dim") or out["hidden_size"] // heads
        if "qk_rope_head_dim" not in out:
            out["head_dim"] = head_dim
        out["num_attention_heads"] = 2
        out["num_key_value_heads"] = 2 if kv in (None, heads) else 1
        out["hidden_size"] = 2 * head_dim
    return out


def _model_layers(config: dict[str, Any], max_model_len: int) -> tuple[list[tuple[Any, Any]], str]:
    """``(rotary module or None, attention facts)`` per decoder layer of vLLM's model.

    Served with ``--max-model-len max_model_len`` (LongRoPE's factors follow it).
    """
    from vllm.config import LoadConfig, ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import (
        init_distributed_environment,
        initialize_model_parallel,
        model_parallel_is_initialized,
    )
    from vllm.model_executor.layers.attention.attention import Attention
    from vllm.model_executor.model_loader.utils import get_model_architecture

    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(shrunk(config), f)
        model_config = ModelConfig(
            model=folder, skip_tokenizer_init=True, dtype="float32", max_model_len=max_model_len
        )
        vllm_config = VllmConfig(
            model_config=model_config, load_config=LoadConfig(load_format="dummy")
        )
        if not model_parallel_is_initialized():  # one rank; no model: every group, MoE's too
            with set_current_vllm_config(VllmConfig()):
                init_distributed_environment(
                    world_size=1,
                    rank=0,
                    local_rank=0,
                    backend="gloo",
                    distributed_init_method=f"tcp://127.0.0.1:{_free_port()}",
                )
                initialize_model_parallel(1, 1)
        cls, arch = get_model_architecture(model_config)
        if cls.__name__.startswith("Transformers"):
            raise NotImplementedError(
                f"vLLM runs {arch} through its transformers backend ({cls.__name__}): "
                "the positions are transformers' own, no vLLM rotary class"
            )
        with set_current_vllm_config(vllm_config):
            model = cls(vllm_config=vllm_config, prefix="")
    ropes: dict[int, Any] = {}
    attns: dict[int, dict[str, Any]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        found = re.search(r"(?:^|\.)layers\.(\d+)\.", name)
        if found is None or "vision" in name or "visual" in name:
            continue
        i = int(found.group(1))
        facts = attns.setdefault(i, {})
        if name.endswith("rotary_emb") and not name.endswith("apply_rotary_emb"):
            ropes.setdefault(i, module)
        elif isinstance(module, Attention):
            facts.setdefault("sliding_window", module.sliding_window)
        if isinstance(getattr(module, "scaling", None), float):  # the model file's q.k scale
            facts.setdefault("softmax_scale", module.scaling)
    count = int(getattr(model_config.hf_text_config, "num_hidden_layers", 0)) or len(attns)
    return [(ropes.get(i), attns.get(i)) for i in range(count)], arch


def _reading(job: dict[str, Any], positions: list[int], context: int) -> dict[str, Any]:
    import vllm
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers import rotary_embedding
    from vllm.model_executor.layers.rotary_embedding import get_rope

    rotary_embedding._ROPE_DICT.clear()  # get_rope's cache outlives a job; a server's does not
    fields: dict[str, Any] = {"vllm.version": vllm.__version__}
    notes: list[str] = []
    layers = []
    if "config" in job:
        max_model_len = int(job.get("max_model_len", context))
        built, arch = _model_layers(job["config"], max_model_len)
        fields["vllm.architecture"] = arch
        fields["vllm.max_model_len"] = max_model_len
    else:
        kwargs = dict(job["get_rope"])
        kwargs["dtype"] = getattr(torch, kwargs.get("dtype", "float32"))
        with set_current_vllm_config(VllmConfig()):
            if "rope_class" in job:  # a model file that constructs the class itself
                module, cls = job["rope_class"].rsplit(".", 1)
                package = rotary_embedding.__name__ + "."
                rope = getattr(importlib.import_module(package + module), cls)(**kwargs)
                built = [(rope, None)]
            else:
                built = [(get_rope(**kwargs), None)]
        if job.get("fope_coefficients") == "identity":  # FoPE's coefficients are weights
            for coef in (built[0][0].cos_coef, built[0][0].sin_coef):
                coef.data.copy_(torch.eye(coef.shape[-1]).expand_as(coef))
            notes.append("FoPE's cos_coef / sin_coef are checkpoint weights: identity here")
        fields["vllm.get_rope"] = {k: str(v) for k, v in kwargs.items()}
        fields["vllm.source"] = job.get("source")
    for i, (rope, attn) in enumerate(built):
        head_size = getattr(rope, "head_size", None) or getattr(attn, "head_size", 0)
        if rope is None:
            layer = _unrotated(int(head_size), len(positions))
        else:
            layer, layer_notes = _probe(rope, positions)
            notes += [f"layer {i}: {n}" for n in layer_notes]
            fields.setdefault("vllm.rotary_class", type(rope).__name__)
        if attn:
            scale = attn.get("softmax_scale")
            if scale is not None and not math.isclose(scale, layer["head_dim"] ** -0.5):
                layer["softmax_scale"] = scale
            layer["sliding_window"] = attn.get("sliding_window")
        layers.append(layer)
    note = "; ".join(dict.fromkeys(notes)) or None
    return dict(
        runtime="vllm",
        positions=positions,
        context=context,
        layers=layers,
        fields=fields,
        note=note,
    )


def _failed(positions: list[int], context: int, err: BaseException) -> dict[str, Any]:
    first = (str(err).strip().splitlines() or [""])[0][:300]
    return dict(
        runtime="vllm",
        positions=positions,
        context=context,
        layers=[],
        fields={},
        note=f"vLLM did not build or run it: {type(err).__name__}: {first}",
    )


def main() -> int:
    # the audit reads past a checkpoint's trained length, which vLLM refuses by default
    os.environ.setdefault("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    request = json.load(sys.stdin)
    positions = [int(p) for p in request["positions"]]
    context = int(request["context"])
    out = []
    for job in request["jobs"]:
        try:
            out.append(_reading(job, positions, context))
        except Exception as err:  # vLLM's own failure is the finding, stated in the note
            traceback.print_exc()
            out.append(_failed(positions, context, err))
    sys.stdout.write("\n" + MARKER + json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
