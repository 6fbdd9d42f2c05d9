"""A tiny pre-LayerNorm causal transformer language model around one positional encoding.

Shapes: ``B`` batch, ``T`` length, ``C`` d_model, ``V`` vocabulary. The blocks follow
GPT-2 (Radford et al. 2019): ``x + Attn(LN(x))`` then ``x + MLP(LN(x))``, a final
LayerNorm and an untied output projection. One encoding instance serves every layer:
its INPUT hook is applied here to the token embeddings, its QK / SCORE / VALUE hooks by
``posenc.MultiHeadAttention`` in each block, so the lab measures the library's own
attention. The exception are the data-dependent encodings with parameters (the
``WEIGHTS`` site: FoX's forget gates, PaTH's Householder projections), which their papers
give each layer on its own, as a function of that layer's input: each block gets its own
instance (``per_layer``). Token embeddings keep PyTorch's N(0, 1) initialisation, the
scale of a sinusoidal table, so neither drowns the other at the start.

``seeded_model`` makes "same seed, same initialisation" exact: the encoding's own
parameters (a learned table, T5's bucket biases, ...) are drawn from their own stream
(seed ``ENCODING_STREAM + seed``; one instance per layer after the other where
``per_layer``), and then every shared parameter (embeddings, blocks, head) from
``seed``, so two models that differ only in their encoding start with the same shared
weights. A learned position table starts as GPT-2's does: N(0, 0.02^2)
(transformers' ``GPT2PreTrainedModel._init_weights``, ``initializer_range`` 0.02;
OpenAI's original TensorFlow code draws ``wpe`` at std 0.01 beside ``wte`` at 0.02).

The attention backend follows what the pass is (``attention_backend``), the same
arithmetic up to float rounding: with gradients (training windows of 64 to 256 tokens)
one SDPA call, the bias (if any) materialized, since the chunked path recomputes each
block in the backward pass; without gradients (evaluation up to 1024 tokens) the chunked
path, whose query blocks skip the keys a causal mask hides and beat SDPA's fused causal
CPU kernel at long lengths (``posenc bench --only lab`` times both passes).

Under ``torch.autocast`` (the lab's bfloat16 mixed precision, ``posenc.lab.precision``)
the blocks' projections and MLP multiply in bfloat16, while the attention core
(``MultiHeadAttention.attention_dtype``, float32 in such a pass and the weights' dtype in
any other), the final LayerNorm and the output projection stay float32, so the logits
that the loss, perplexity and argmax read are not rounded to bfloat16's 8 significant
bits.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from posenc._dtypes import autocast_enabled, without_autocast
from posenc.attention import MultiHeadAttention
from posenc.base import PositionalEncoding, Site
from posenc.encodings.learned import LearnedPositionalEncoding

__all__ = [
    "ENCODING_STREAM",
    "LEARNED_STD",
    "TinyLM",
    "attention_backend",
    "per_layer",
    "seeded_model",
]

#: The encoding's parameters are drawn with seed ``ENCODING_STREAM + seed``.
ENCODING_STREAM = 1 << 32
#: Standard deviation of a learned position table at initialisation (GPT-2's).
LEARNED_STD = 0.02


def attention_backend(encoding: PositionalEncoding, *, grad: bool) -> str:
    """The ``MultiHeadAttention`` backend of a pass with (``grad``) or without gradients.

    A VALUE-site encoding keeps ``"auto"`` (SDPA cannot apply its term); otherwise
    ``"sdpa"`` with gradients and ``"chunked"`` without (see the module docstring).
    """
    if encoding.sites & Site.VALUE:
        return "auto"
    return "sdpa" if grad else "chunked"


def per_layer(encoding: PositionalEncoding) -> bool:
    """Whether each block gets its own instance of ``encoding``: a ``WEIGHTS``-site
    encoding with parameters (its gates are a layer's own projections of its input)."""
    return bool(encoding.sites & Site.WEIGHTS) and any(True for _ in encoding.parameters())


class _Block(nn.Module):
    def __init__(self, d_model: int, num_heads: int, encoding: PositionalEncoding) -> None:
        super().__init__()
        self.ln_attn = nn.LayerNorm(d_model)
        self.attn = MultiHeadAttention(d_model, num_heads, position=encoding, causal=True)
        self.ln_mlp = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model)
        )

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        x = x + self.attn(self.ln_attn(x), positions)
        return x + self.mlp(self.ln_mlp(x))


class TinyLM(nn.Module):
    """Causal LM: tokens ``[B, T]`` -> next-token logits ``[B, T, V]``.

    Args:
        encoding: the positional encoding (shared by all layers).
        vocab_size: ``V`` (256 for bytes).
        d_model: ``C``.
        num_layers: number of blocks.
        num_heads: attention heads (``C`` divisible by it).
        layer_encodings: where ``per_layer(encoding)``, the instances of blocks 1, 2, ...
            (block 0 uses ``encoding``); None: copies of ``encoding`` (whose weights a
            ``load_state_dict`` then replaces).
    """

    def __init__(
        self,
        encoding: PositionalEncoding,
        *,
        vocab_size: int,
        d_model: int,
        num_layers: int,
        num_heads: int,
        layer_encodings: Sequence[PositionalEncoding] | None = None,
    ) -> None:
        super().__init__()
        self.shape = {
            "vocab_size": vocab_size,
            "d_model": d_model,
            "num_layers": num_layers,
            "num_heads": num_heads,
        }
        self.embedding = nn.Embedding(vocab_size, d_model)  # N(0, 1)
        self.encoding = encoding
        if not per_layer(encoding):
            layers = [encoding] * num_layers
        elif layer_encodings is None:
            layers = [encoding, *(copy.deepcopy(encoding) for _ in range(num_layers - 1))]
        else:
            layers = [encoding, *layer_encodings]
        if len(layers) != num_layers:
            raise ValueError(f"{num_layers} layers but {len(layers)} layer encodings")
        self.blocks = nn.ModuleList(_Block(d_model, num_heads, enc) for enc in layers)
        self.ln_out = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, tokens: Tensor, positions: Tensor | None = None) -> Tensor:
        """Logits ``[B, T, V]`` (float32) of ``tokens [B, T]`` at ``positions [T]``
        (default ``arange(T)``; a context-parallel shard passes its global positions)."""
        backend = attention_backend(self.encoding, grad=torch.is_grad_enabled())
        core = torch.float32 if autocast_enabled(tokens.device.type) else None
        for block in self.blocks:
            block.attn.backend = backend
            block.attn.attention_dtype = core  # the weights' dtype outside autocast
        if positions is None:
            positions = torch.arange(tokens.shape[1], device=tokens.device)  # [T]
        x = self.embedding(tokens)  # [B, T, C]
        if self.encoding.sites & Site.INPUT:
            x = self.encoding.embed(x, positions)
        for block in self.blocks:
            x = block(x, positions)
        with without_autocast(tokens.device.type):  # float32 logits
            return self.head(self.ln_out(x))  # [B, T, V] (x: the float32 residual stream)

    def with_encoding(self, encoding: PositionalEncoding) -> TinyLM:
        """A copy of this model (same weights) that uses ``encoding`` instead.

        Used to evaluate a rotary scaling or an interpolating learned table on a trained
        model; ``encoding`` must have the same parameters as the current one.
        """
        twin = TinyLM(encoding, **self.shape).to(next(self.parameters()).device)
        twin.load_state_dict(self.state_dict())
        return twin


def seeded_model(
    make_encoding: Callable[[], PositionalEncoding], *, seed: int, **shape: int
) -> TinyLM:
    """A ``TinyLM`` whose shared weights depend on ``seed`` only (see the module docstring).

    Args:
        make_encoding: builds the encoding (called with the encoding's stream seeded).
        seed: the run's seed.
        shape: ``TinyLM``'s keywords (``vocab_size``, ``d_model``, ``num_layers``,
            ``num_heads``).
    """
    torch.manual_seed(ENCODING_STREAM + seed)
    encoding = make_encoding()
    if isinstance(encoding, LearnedPositionalEncoding):
        nn.init.normal_(encoding.weight, mean=0.0, std=LEARNED_STD)
    more = range(shape["num_layers"] - 1) if per_layer(encoding) else range(0)
    layers = [make_encoding() for _ in more] or None
    torch.manual_seed(seed)
    return TinyLM(encoding, layer_encodings=layers, **shape)
