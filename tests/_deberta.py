"""Shared by the DeBERTa tests: a tiny random DeBERTa / DeBERTa-v2 model and a comparison
of every layer's ``DisentangledSelfAttention`` with posenc's attention on the same input.

Shapes: ``B`` batch, ``T`` length, ``C`` hidden size, ``H`` heads, ``D`` head dim.
"""

from __future__ import annotations

import itertools

import torch
import transformers

import posenc
from conftest import tolerances
from posenc import Compose, DisentangledAttention
from posenc.hf.absolute import build_position_module, load_hf_weights

B, T, C, H, LAYERS = 2, 11, 16, 2, 2
D = C // H


def deberta_model(model_type: str, **fields):
    """A two-layer random model of ``model_type`` (no dropout) in eval mode."""
    torch.manual_seed(0)
    cls = transformers.CONFIG_MAPPING[model_type]
    cfg = cls(
        hidden_size=C,
        num_attention_heads=H,
        num_hidden_layers=LAYERS,
        intermediate_size=32,
        vocab_size=99,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        **fields,
    )
    model = transformers.AutoModel.from_config(cfg).eval()
    with torch.no_grad():  # move the zero-initialized biases (q_bias, v_bias, LayerNorms) off 0
        for name, param in model.named_parameters():
            if name.endswith("bias") or "LayerNorm" in name:
                param.add_(0.1 * torch.randn_like(param))
    return model


def _projections(att) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``(weight, bias)`` of the query, key and value projections of one attention."""
    if hasattr(att, "in_proj"):  # DeBERTa: one [3 H D, C] matrix, q/k/v interleaved per head
        rows = att.in_proj.weight.view(H, 3, D, C)
        zero = torch.zeros(H * D)
        biases = (att.q_bias.detach(), zero, att.v_bias.detach())
        return [(rows[:, i].reshape(H * D, C), b) for i, b in enumerate(biases)]
    return [(p.weight, p.bias) for p in (att.query_proj, att.key_proj, att.value_proj)]


def _attention_inputs(model) -> list[dict]:
    """Each layer's hidden states, context and probabilities on one random batch."""
    seen: list[dict] = []

    def hook(module, args, kwargs, output):
        seen.append({"hidden": args[0], "context": output[0], "probs": output[1]})

    handles = [
        layer.attention.self.register_forward_hook(hook, with_kwargs=True)
        for layer in model.encoder.layer
    ]
    ids = torch.randint(3, 99, (B, T), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model(input_ids=ids, output_attentions=True)
    for handle in handles:
        handle.remove()
    return seen


def disentangled_part(enc: posenc.PositionalEncoding) -> DisentangledAttention:
    if isinstance(enc, Compose):
        (found,) = [e for e in enc.encodings if isinstance(e, DisentangledAttention)]
        return found
    assert isinstance(enc, DisentangledAttention)
    return enc


def compare_with_transformers(model_type: str, *, offsets=(0,), **fields) -> int:
    """Every layer of a tiny ``model_type`` model against posenc; returns the layers seen.

    posenc's side is ``build_position_module`` on the model's config with the layer's
    weights copied by ``load_hf_weights(layer_idx=i)``, inside a ``MultiHeadAttention``
    holding the layer's query/key/value projections (output projection: the identity, so
    that it returns the context). Positions start at each of ``offsets`` (relative: the same
    scores).
    Probabilities and contexts must agree within float32 roundings (transformers
    rounds ``sqrt(D * s)`` to float32; posenc divides by ``sqrt(s)`` and ``sqrt(D)``).
    """
    model = deberta_model(model_type, **fields)
    built = build_position_module(model_type, model.config.to_dict())
    tol = tolerances(torch.float32)  # float32 on both sides, a few roundings apart
    for (i, seen), start in itertools.product(enumerate(_attention_inputs(model)), offsets):
        positions = torch.arange(start, start + T)
        load_hf_weights(built, model, layer_idx=i)
        enc = disentangled_part(built)
        if isinstance(built, Compose):  # position_biased_input: the table, row p at position p
            table = model.embeddings.position_embeddings.weight
            torch.testing.assert_close(built.encodings[0].weight, table, rtol=0, atol=0)
        layer = posenc.MultiHeadAttention(C, H, position=enc, causal=False, bias=True)
        att = model.encoder.layer[i].attention.self
        with torch.no_grad():
            for proj, (weight, bias) in zip(
                (layer.q_proj, layer.k_proj, layer.v_proj), _projections(att), strict=True
            ):
                proj.weight.copy_(weight)
                proj.bias.copy_(bias)
            layer.out_proj.weight.copy_(torch.eye(C))
            layer.out_proj.bias.zero_()
            x = seen["hidden"]
            torch.testing.assert_close(layer(x, positions), seen["context"], **tol)
            q = layer.q_proj(x).view(B, T, H, D).transpose(1, 2)
            k = layer.k_proj(x).view(B, T, H, D).transpose(1, 2)
            q, k = enc.rotate(q, k, positions, positions)
            scores = q @ k.transpose(-1, -2) / D**0.5 + enc.score_bias(q, k, positions, positions)
            torch.testing.assert_close(scores.softmax(-1), seen["probs"], **tol)
    return len(model.encoder.layer)
