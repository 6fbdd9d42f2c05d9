"""``ring_context``: every ``posenc.MultiHeadAttention`` of a model attends by ring attention
(``posenc.parallel.ring_attention``) while the context is open, without a change to the model.

Shapes: ``B`` batch, ``T`` the tokens of this rank's shard, ``C`` d_model.

Inside the context, each layer's forward is the usual one (projections, grouped heads, the
output projection) with its attention core replaced by the ring: its encoding rotates,
biases and masks at the positions the model passes (``layer(x, positions, segment_ids=...)``),
which must be the shard's *global* positions, e.g. ``ShardLayout.positions``. The layers are
changed on the instance only (the core is an attribute of each layer for the duration), so
``posenc.attention`` knows nothing of ``posenc.parallel``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from datetime import timedelta

import torch.distributed as dist
from torch import Tensor, nn

from posenc.attention.module import MultiHeadAttention
from posenc.parallel.ring import ring_attention

__all__ = ["ring_context"]


@contextlib.contextmanager
def ring_context(
    model: nn.Module,
    *,
    group: dist.ProcessGroup | None = None,
    timeout: timedelta | float | None = None,
    token_positions: Tensor | None = None,
) -> Iterator[list[MultiHeadAttention]]:
    """Run every ``MultiHeadAttention`` in ``model`` (itself included) by ring attention over
    ``group`` while the context is open; yields the layers it changed.

    Each rank runs the model on its shard ``x [B, T, C]`` with the shard's global
    ``positions`` (``[T]`` or ``[B, T]``) and, for packed documents, ``segment_ids [B, T]``.
    The outputs and input gradients are the unsplit model's rows for the shard; parameter
    gradients are this rank's share (see ``ring_attention``), summed over the group by the
    data-parallel all-reduce. A layer's ``block_size`` sets the ring's query blocks; its
    ``backend`` is not used (the ring computes its blocks itself).

    Args:
        model: a module holding ``MultiHeadAttention`` layers.
        group: the context-parallel process group (None: the default group).
        timeout: seconds (or a ``timedelta``) a rank waits for another; None: the group's.
        token_positions: ``[T]`` or ``[B, T]``, the shard's global token indices (e.g.
            ``ShardLayout.indices``), for the layers whose encoding takes structured
            positions (M-RoPE's ``[3, B, T]``, axial RoPE's): ``MultiHeadAttention`` masks
            those tokens by their index, which within a shard is not the global one.

    Raises:
        ValueError: ``model`` holds no ``MultiHeadAttention``; inside the context, a layer
            called with a KV cache, a key padding mask (pad with a segment of its own), or
            attention dropout in training mode, structured positions without
            ``token_positions``; and ``ring_attention``'s errors.
        TypeError: ``model`` is not an ``nn.Module``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    layers = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    if not layers:
        raise ValueError(f"{type(model).__name__} holds no posenc.MultiHeadAttention layer")
    saved = [layer.__dict__.get("_core") for layer in layers]
    for layer in layers:
        layer.__dict__["_core"] = _ring_core(layer, group, timeout, token_positions)
    try:
        yield layers
    finally:
        for layer, core in zip(layers, saved, strict=True):
            if core is None:
                del layer.__dict__["_core"]
            else:
                layer.__dict__["_core"] = core


def _ring_core(
    layer: MultiHeadAttention,
    group: dist.ProcessGroup | None,
    timeout: timedelta | float | None,
    token_positions: Tensor | None,
) -> Callable[..., Tensor]:
    """The attention core of ``layer`` (``MultiHeadAttention._core``'s arguments) by the ring."""

    def core(
        q: Tensor,
        k: Tensor,
        v: Tensor,
        q_pos: Tensor,
        rotary_pos: Tensor | None,
        cache: object,
        key_padding_mask: Tensor | None,
        segment_ids: Tensor | None,
        aligned: bool,
        gates: Tensor | None,
    ) -> Tensor:
        del aligned, gates  # the ring masks by positions; WEIGHTS encodings are refused
        for what, value in (("a KV cache", cache), ("a key_padding_mask", key_padding_mask)):
            if value is not None:
                raise ValueError(
                    f"ring attention does not take {what}; pad a shard with tokens of a "
                    "segment of their own (segment_ids) instead of a padding mask"
                )
        if layer.training and layer.dropout > 0:
            raise ValueError(
                f"ring attention has no attention dropout; the layer has dropout={layer.dropout}"
            )
        if rotary_pos is not None:  # the layer ordered the tokens by their shard index
            if token_positions is None:
                raise ValueError(
                    f"{type(layer.position).__name__} rotates at structured positions, and "
                    "the layer masks its tokens by their index in the shard; pass the "
                    "shard's global token indices: ring_context(..., token_positions=...)"
                )
            q_pos = token_positions.to(q.device)
        return ring_attention(
            q, k, v, positions=q_pos, position=layer.position, rotary_positions=rotary_pos,
            segment_ids=segment_ids, causal=layer.causal, group=group, sinks=layer.sinks,
            block_size=layer.block_size, timeout=timeout,
        )  # fmt: skip

    return core
