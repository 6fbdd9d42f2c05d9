"""Dual chunk attention (DCA): RoPE attention beyond the trained length without training
(An et al. 2024, "Training-Free Long-Context Scaling of Large Language Models", ICML 2024,
sec. 3, "ChunkLlama"; Qwen2.5-1M's ``dual_chunk_attention_config``: Yang et al. 2025,
"Qwen2.5-1M Technical Report", sec. 4.1).

Shapes: ``B`` batch, ``H`` heads, ``Tq`` queries, ``Tk`` keys, ``D`` head_dim.

The sequence is cut into chunks of ``s = chunk_size - local_size`` tokens (chunk ``n(i) =
floor(i / s)``, offset ``i' = i mod s``). Every key is rotated at its offset ``j'``; the
query is rotated at an index that depends on where the key lies, and the three kinds of
logits are merged into one softmax::

    intra-chunk       (n(i) = n(j)):      query index i'                   (exact: i - j)
    successive-chunk  (n(i) = n(j) + 1):  query index min(i' + s, c)
    inter-chunk       (n(i) >= n(j) + 2): query index min(2s - 1, c)       (c = chunk_size)

so the relative position ``query index - j'`` equals ``i - j`` whenever ``i - j <=
local_size`` (the local window stays exact) and never exceeds ``c = s + local_size``:
every index lies in ``[0, c]`` whatever the length, the paper's bound (its ``s + w``,
chosen below the trained length). Sequences of at most ``chunk_size`` tokens get plain
RoPE attention. The index maps follow the authors' reference implementation
(HKUNLP/ChunkLlama, ``chunkllama_attn_replace.py``: keys at ``j mod s``, successive
queries at ``min(i' + s, chunk_size)``, inter-chunk queries at that map's value for
``i' = s - 1``), which is what vLLM's ``DualChunkRotaryEmbedding`` runs for Qwen2.5-1M;
transformers 5.24 reads no ``dual_chunk_attention_config``.

The logits of a query depend on which chunk each key lies in, so DCA computes the
attention weights itself: a WEIGHTS-site encoding (``posenc.base``) with no gates, served
by every backend of ``MultiHeadAttention`` by query blocks (``chunked``: ``block_size``),
KV-cache decoding included (keys are cached unrotated and rotated at their offsets per
call). ``DualChunkAttention.from_hf_config`` reads a checkpoint's
``dual_chunk_attention_config``. Not supported: Qwen2.5-1M's sparse (MInference)
prefill, which approximates these weights; RoPE scalings (DCA replaces them);
composition with other encodings; attention sinks. Its backward keeps every block's
weights (``O(B H Tq Tk)`` memory with gradients).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from posenc._checks import check_bool, check_float, check_int, float_positions
from posenc._dtypes import compute_dtype
from posenc.base import PositionalEncoding, Site, register
from posenc.encodings.data_dependent._common import visible_keys
from posenc.encodings.rotary.apply import apply_rope
from posenc.encodings.rotary.scaling import DefaultRope

__all__ = ["DualChunkAttention", "dual_chunk_indices"]


def _check_sizes(chunk_size: int, local_size: int) -> tuple[int, int]:
    chunk_size = check_int("chunk_size", chunk_size, minimum=2)
    local_size = check_int("local_size", local_size, minimum=0)
    if 2 * local_size >= chunk_size:
        raise ValueError(
            f"local_size must be below chunk_size / 2 (chunks of chunk_size - local_size "
            f"tokens must be longer than the local window), got local_size={local_size}, "
            f"chunk_size={chunk_size}"
        )
    return chunk_size, local_size


def _check_integer(q_pos: Tensor, k_pos: Tensor) -> None:
    for name, pos in (("q_pos", q_pos), ("k_pos", k_pos)):
        if pos.is_floating_point() or pos.is_complex() or pos.dtype == torch.bool:
            raise TypeError(f"dual chunk attention needs integer {name}, got dtype {pos.dtype}")


def _query_indices(q_pos: Tensor, chunk_size: int, local_size: int) -> tuple[Tensor, ...]:
    """``(intra, successive, inter)`` query indices of ``q_pos [..]`` (inter: 0-d)."""
    s = chunk_size - local_size
    offset = torch.remainder(q_pos, s)
    successive = (offset + s).clamp(max=chunk_size)
    return offset, successive, q_pos.new_tensor(min(2 * s - 1, chunk_size))


def _kinds(q_pos: Tensor, k_pos: Tensor, chunk_length: int) -> Tensor:
    """``[.., Tq, Tk]``: 0 intra-chunk, 1 successive, 2 inter-chunk (and later keys: 0)."""
    gap = torch.div(q_pos, chunk_length, rounding_mode="floor").unsqueeze(-1) - torch.div(
        k_pos, chunk_length, rounding_mode="floor"
    ).unsqueeze(-2)
    return gap.clamp(0, 2)


def dual_chunk_indices(
    q_pos: Tensor, k_pos: Tensor, *, chunk_size: int, local_size: int
) -> tuple[Tensor, Tensor]:
    """DCA's position indices: ``(q_index [.., Tq, Tk], k_index [.., Tk])``, the index the
    query is rotated at for each key and the keys' indices ``k_pos mod s``.

    Args:
        q_pos: integer query positions ``[Tq]`` or ``[B, Tq]``.
        k_pos: integer key positions ``[Tk]`` or ``[B, Tk]``.
        chunk_size: ``c``, the largest index (Qwen2.5-1M: 262144).
        local_size: the exact local window (Qwen2.5-1M: 8192), below ``c / 2``.

    Raises:
        ValueError: sizes out of range.
        TypeError: non-integer positions.
    """
    chunk_size, local_size = _check_sizes(chunk_size, local_size)
    _check_integer(q_pos, k_pos)
    s = chunk_size - local_size
    intra, successive, inter = _query_indices(q_pos, chunk_size, local_size)
    kind = _kinds(q_pos, k_pos, s)
    q_index = torch.where(
        kind == 0, intra.unsqueeze(-1), torch.where(kind == 1, successive.unsqueeze(-1), inter)
    )
    return q_index, torch.remainder(k_pos, s)


@register(
    "dual_chunk",
    paper="An et al. 2024, Training-Free Long-Context Scaling of Large Language Models (ICML)",
    description="RoPE attention over chunks: intra, successive and inter-chunk query indices, "
    "all below chunk_size (ChunkLlama, Qwen2.5-1M)",
)
class DualChunkAttention(PositionalEncoding):
    """Dual chunk attention over RoPE as a WEIGHTS-site encoding (causal only).

    Args:
        head_dim: ``D``, even.
        num_heads: ``H`` (the shape of the empty gates).
        chunk_size: ``c``, the largest position index used (at most the trained length;
            default: Qwen2.5-1M's 262144).
        local_size: the exact local window, below ``c / 2``; chunks hold ``c - local_size``
            (default: Qwen2.5-1M's 8192).
        base: RoPE's base (Qwen2.5-1M: 10,000,000).
        interleaved: RoPE's pair layout (False: half-split, as Llama and Qwen).
        causal: must be True.

    Raises:
        ValueError: odd ``head_dim``, sizes out of range, ``causal=False``.
    """

    sites = Site.WEIGHTS
    causal_only = True

    def __init__(
        self,
        head_dim: int,
        num_heads: int,
        *,
        chunk_size: int = 262144,
        local_size: int = 8192,
        base: float = 10000.0,
        interleaved: bool = False,
        causal: bool = True,
    ) -> None:
        super().__init__()
        if not check_bool("causal", causal):
            raise ValueError("dual chunk attention is only defined for causal attention")
        self.head_dim = check_int("head_dim", head_dim)
        if self.head_dim % 2:
            raise ValueError(f"dual chunk attention needs an even head_dim, got {head_dim}")
        self.num_heads = check_int("num_heads", num_heads)
        self.chunk_size, self.local_size = _check_sizes(chunk_size, local_size)
        self.base = check_float("base", base, positive=True)
        self.interleaved = check_bool("interleaved", interleaved)
        self._inv_freq = DefaultRope().inv_freq(self.head_dim, self.base)[0]  # float64

    @classmethod
    def from_hf_config(cls, config: Any) -> DualChunkAttention:
        """The DCA of a checkpoint's ``dual_chunk_attention_config`` (Qwen2.5-1M), from a
        ``config.json`` dict or a transformers config: its ``chunk_size`` and
        ``local_size``, the RoPE base (``rope_theta``, or ``rope_parameters["rope_theta"]``)
        and the head shape. ``posenc.from_hf_config`` returns what transformers runs for
        such a checkpoint, plain RoPE (it reads no ``dual_chunk_attention_config``).

        Raises:
            ValueError: no ``dual_chunk_attention_config``, or one without ``chunk_size``
                and ``local_size``; a RoPE scaling other than the default.
        """
        get = config.get if isinstance(config, dict) else lambda key: getattr(config, key, None)
        dca = get("dual_chunk_attention_config")
        if not isinstance(dca, dict) or not {"chunk_size", "local_size"} <= set(dca):
            raise ValueError(
                "config needs a dual_chunk_attention_config with chunk_size and local_size, "
                f"got {dca!r}"
            )
        rope = get("rope_parameters") or get("rope_scaling") or {}
        kind = rope.get("rope_type", rope.get("type", "default"))
        if kind != "default":
            raise ValueError(f"dual chunk attention replaces RoPE scaling; got rope_type={kind!r}")
        heads = get("num_attention_heads")
        head_dim = get("head_dim") or get("hidden_size") // heads
        base = get("rope_theta") or rope.get("rope_theta", 10000.0)
        return cls(
            head_dim, heads, chunk_size=dca["chunk_size"], local_size=dca["local_size"], base=base
        )

    def gates(self, x: Tensor, past: Tensor | None = None) -> Tensor:
        """No gates: ``[B, H, T, 0]``."""
        return x.new_zeros(x.shape[0], self.num_heads, x.shape[1], 0)

    def _rotate(self, x: Tensor, index: Tensor) -> Tensor:
        """RoPE of ``x [B, H, T, D]`` at integer ``index [T] | [B, T]`` (float64 angles)."""
        angles = float_positions(index, torch.float64).unsqueeze(-1) * self._inv_freq.to(x.device)
        work = compute_dtype(x.dtype)
        return apply_rope(
            x, angles.cos().to(work), angles.sin().to(work), interleaved=self.interleaved
        )

    def weights(
        self,
        q: Tensor,
        k: Tensor,
        q_pos: Tensor,
        k_pos: Tensor,
        q_gates: Tensor,
        k_gates: Tensor,
        mask: Tensor | None = None,
    ) -> Tensor:
        """``[B, H, Tq, Tk]`` attention weights of the unrotated ``q [B, H, Tq, D]`` and
        ``k [B, H, Tk, D]`` at integer positions (zero where a key is not visible).

        Raises:
            ValueError, TypeError: bad shapes or dtypes; non-integer positions.
        """
        visible = visible_keys(q, k, q_pos, k_pos, mask, strict=False)
        _check_integer(q_pos, k_pos)
        q_pos, k_pos = q_pos.to(q.device), k_pos.to(q.device)
        s = self.chunk_size - self.local_size
        work = compute_dtype(q.dtype)
        keys = self._rotate(k, torch.remainder(k_pos, s)).to(work)
        intra, successive, inter = _query_indices(q_pos, self.chunk_size, self.local_size)
        logits = [
            torch.matmul(self._rotate(q, index).to(work), keys.transpose(-2, -1))
            for index in (intra, successive, inter.expand_as(intra))
        ]
        kind = _kinds(q_pos, k_pos, s)
        kind = kind.unsqueeze(-3) if kind.dim() == 3 else kind  # [B|1, 1|., Tq, Tk]
        merged = torch.where(kind == 0, logits[0], torch.where(kind == 1, logits[1], logits[2]))
        merged = (merged * self.head_dim**-0.5).masked_fill(~visible, float("-inf"))
        probs = torch.softmax(merged, dim=-1)
        return torch.where(visible, probs, 0.0).to(q.dtype)  # a row without keys: 0

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, num_heads={self.num_heads}, chunk_size={self.chunk_size}, "
            f"local_size={self.local_size}, base={self.base}, interleaved={self.interleaved}"
        )
