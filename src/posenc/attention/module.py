"""Multi-head attention that takes any positional encoding (Vaswani et al. 2017, "Attention
Is All You Need", sec. 3.2.2; grouped-query heads: Ainslie et al. 2023, "GQA").

Shapes: ``B`` batch, ``T`` new tokens, ``Tk`` keys (cached + new), ``C`` d_model, ``H``
query heads, ``Hkv`` key/value heads, ``D = C / H`` head_dim.

The layer calls its encoding's hooks and never needs to know which encoding it holds:

1. ``rotate(q, k_new, q_pos, k_pos_new)`` (QK site) on the new keys, before caching, so a
   cached key is rotated once with its own position;
2. ``score_bias(q_block, k_all, q_pos_block, k_pos_all)`` (SCORE site), ``k_all``
   expanded to ``H`` heads, once per query block, possibly with a prefix of the keys
   (under a causal mask, keys no query of the block can see are skipped);
3. ``value_term(probs, q_pos, k_pos)`` (VALUE site), added to ``probs @ v``;
4. ``gates(x, cached_gates)`` (WEIGHTS site) on the layer's input, cached beside the keys,
   then ``weights(q_block, k_all, q_pos, k_pos, q_gates, k_gates, mask)`` in place of the
   softmax of the logits (data-dependent attention: FoX, stick-breaking).

The INPUT site (``embed``) is *not* applied here: the model adds it to the token
embeddings once, before the first layer (``x = position.embed(tok_emb, positions)``).

Masking is defined by positions, never by array indices: under ``causal=True`` a key is
visible iff ``k_pos <= q_pos``. That one rule serves full sequences, KV-cache decoding,
left padding and shifted positions alike. Packed sequences (several documents in one
row, positions restarting at 0) also need ``segment_ids``, which block attention across
documents; without them a later document's position-0 token would be visible to every
token of the earlier one. A query with no visible key (a padded query whose own key is
padding) outputs zeros.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from posenc._checks import (
    check_bool,
    check_float_dtype,
    check_int,
    check_probability,
    check_tensor,
    resolve_positions,
)
from posenc._dtypes import without_autocast
from posenc.attention.backends import DEFAULT_BLOCK_SIZE, Masking, attend, check_backend
from posenc.base import PositionalEncoding, Site, build
from posenc.encodings.nope import NoPE
from posenc.kv_cache import KVCache

__all__ = ["MultiHeadAttention"]


def repeat_kv(x: Tensor, num_heads: int) -> Tensor:
    """Expand ``[B, Hkv, T, D]`` to ``[B, H, T, D]``: query head ``h`` reads kv head
    ``h // (H / Hkv)`` (the grouping of Llama's ``repeat_kv``)."""
    batch, kv_heads, length, dim = x.shape
    if kv_heads == num_heads:
        return x
    group = num_heads // kv_heads
    return (
        x[:, :, None]
        .expand(batch, kv_heads, group, length, dim)
        .reshape(batch, num_heads, length, dim)
    )


def _check_ids(name: str, ids: Tensor | None, shapes: list[tuple[int, int]]) -> None:
    """Validate a ``[B, T]`` key padding mask (bool) or segment ids (integer)."""
    if ids is None:
        return
    if not isinstance(ids, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(ids).__name__}")
    is_mask = name == "key_padding_mask"
    if is_mask and ids.dtype != torch.bool:
        raise TypeError(f"{name} must be a bool tensor (True = attend), got dtype {ids.dtype}")
    if not is_mask and (ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool):
        raise TypeError(f"{name} must be an integer tensor, got dtype {ids.dtype}")
    if tuple(ids.shape) not in shapes:
        want = " or ".join(str(list(s)) for s in dict.fromkeys(shapes))
        raise ValueError(f"{name} must have shape {want}, got {list(ids.shape)}")


class MultiHeadAttention(nn.Module):
    """Self-attention ``[B, T, C] -> [B, T, C]`` with a pluggable positional encoding.

    Args:
        d_model: model width ``C``; divisible by ``num_heads``.
        num_heads: query heads ``H``.
        position: a ``PositionalEncoding``, or the name of a registered one, built with
            ``posenc.build(name, d_model=, num_heads=, head_dim=, causal=)``. None: NoPE.
            Its QK, SCORE and VALUE hooks are applied here; its INPUT site (``embed``)
            is the model's to apply to the token embeddings.
        causal: mask keys at later positions (``k_pos > q_pos``).
        dropout: attention dropout on the probabilities (training mode only).
        num_kv_heads: key/value heads ``Hkv`` (grouped-query attention); divides
            ``num_heads``. None: ``num_heads``.
        bias: whether the four projections have biases.
        backend: ``"auto"`` (SDPA for QK-only encodings, the chunked path for SCORE and
            VALUE ones, FlexAttention for long float32 CPU inference where it applies),
            ``"sdpa"``, ``"eager"``, ``"chunked"`` or ``"flex"``; see
            ``posenc.attention.backends``.
        block_size: queries per block of the chunked path.
        attention_dtype: a floating dtype in which the attention core runs: queries,
            keys and values are cast to it right after their projections, and the
            rotation, bias, softmax and weighted sum run in it with autocast off (the
            output is cast back to ``x``'s dtype). Under a CPU bfloat16 autocast, float32
            keeps the products of the projections in bfloat16 while avoiding SDPA's
            bfloat16 CPU backward, several times slower than float32's at small head
            sizes (``posenc.lab`` trains this way). None: the projections' output dtype.
        sinks: learn one sink logit per query head (``self.sinks [H]``, zeros at first)
            that joins every row's softmax denominator, as GPT-OSS does (OpenAI 2025);
            see ``posenc.attention.sinks``. Not with a WEIGHTS-site encoding.

    Raises:
        ValueError: ``d_model`` not divisible by ``num_heads``, ``num_heads`` not divisible
            by ``num_kv_heads``, an unknown backend, ``backend="sdpa"`` with a VALUE-site
            encoding, a causal-only encoding with ``causal=False``, or ``sinks`` with a
            WEIGHTS-site encoding.
        TypeError: ``position`` neither None, a name nor a ``PositionalEncoding``, or an
            ``attention_dtype`` that is not a floating ``torch.dtype``.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        *,
        position: PositionalEncoding | str | None = None,
        causal: bool = True,
        dropout: float = 0.0,
        num_kv_heads: int | None = None,
        bias: bool = False,
        backend: str = "auto",
        block_size: int = DEFAULT_BLOCK_SIZE,
        attention_dtype: torch.dtype | None = None,
        sinks: bool = False,
    ) -> None:
        super().__init__()
        if attention_dtype is not None:
            check_float_dtype("attention_dtype", attention_dtype)
        self.attention_dtype = attention_dtype
        self.d_model = check_int("d_model", d_model)
        self.num_heads = check_int("num_heads", num_heads)
        if d_model % num_heads:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
        self.num_kv_heads = check_int(
            "num_kv_heads", num_heads if num_kv_heads is None else num_kv_heads
        )
        if num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={num_heads} is not divisible by num_kv_heads={self.num_kv_heads}"
            )
        if not isinstance(causal, bool):
            raise TypeError(f"causal must be a bool, got {causal!r}")
        check_bool("bias", bias)
        self.head_dim = d_model // num_heads
        self.causal = causal
        self.dropout = check_probability("dropout", dropout)
        self.block_size = check_int("block_size", block_size)
        self.position = self._resolve_position(position)
        check_backend(backend, self.position)
        self.backend = backend
        kv_width = self.num_kv_heads * self.head_dim
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, kv_width, bias=bias)
        self.v_proj = nn.Linear(d_model, kv_width, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.sinks = None
        if check_bool("sinks", sinks):
            if self.position.sites & Site.WEIGHTS:
                raise ValueError(
                    f"sinks=True with {type(self.position).__name__}, which computes the "
                    "attention weights itself (WEIGHTS site)"
                )
            self.sinks = nn.Parameter(torch.zeros(num_heads))

    def _resolve_position(self, position: PositionalEncoding | str | None) -> PositionalEncoding:
        if position is None:
            position = NoPE()
        elif isinstance(position, str):
            shape = {"num_heads": self.num_heads, "head_dim": self.head_dim}
            try:
                position = build(position, d_model=self.d_model, causal=self.causal, **shape)
            except TypeError as err:
                raise TypeError(
                    f"encoding {position!r} needs arguments beyond the model shape ({err}); "
                    f"pass an instance: position=posenc.build({position!r}, ...)"
                ) from err
        elif not isinstance(position, PositionalEncoding):
            raise TypeError(
                "position must be None, a registered name or a PositionalEncoding, "
                f"got {type(position).__name__}"
            )
        if position.causal_only and not self.causal:
            raise ValueError(
                f"{type(position).__name__} is only defined for causal attention; got causal=False"
            )
        return position

    def forward(
        self,
        x: Tensor,
        positions: Tensor | None = None,
        *,
        key_padding_mask: Tensor | None = None,
        segment_ids: Tensor | None = None,
        cache: KVCache | None = None,
    ) -> Tensor:
        """Attend over ``x [B, T, C]`` (and the cached keys, if any).

        Args:
            x: the token representations.
            positions: ``[T]`` or ``[B, T]`` (integer or float). None: ``arange(T)``, or
                continuing after each sequence's last cached position. Encodings with
                structured positions (an ``attention_positions`` method: M-RoPE's
                ``[3, T]`` / ``[3, B, T]``, axial RoPE's ``[N, 2]``) take those; the tokens
                are then masked and cached by their index, as if positions were None.
            key_padding_mask: bool, True = attend; ``[B, T]`` for the new tokens, or
                ``[B, Tk]`` covering the cached keys too (replacing the cached mask).
            segment_ids: ``[B, T]`` integer document ids of packed sequences; keys of
                another segment are not visible.
            cache: a ``KVCache`` to read and append to (incremental decoding).

        Returns:
            ``[B, T, C]`` in ``x``'s dtype.

        Raises:
            ValueError: ``x`` not ``[B, T, d_model]``, or a positions, mask or segment ids
                shape that does not match ``x`` (and the cache).
            TypeError: wrong dtypes (float mask, float segment ids, bf16 positions, ...).
            RuntimeError: ``cache`` is in use by another call (threads sharing one cache).
        """
        check_tensor("x", x, ndim=3)
        width = x.shape[-1]
        if width != self.d_model:
            raise ValueError(f"x has last dimension {width}, expected d_model={self.d_model}")
        if x.dtype != self.q_proj.weight.dtype:
            raise TypeError(
                f"x has dtype {x.dtype} but the layer's weights are {self.q_proj.weight.dtype}; "
                f"convert one of them (e.g. layer.to({x.dtype}))"
            )
        if cache is not None and not isinstance(cache, KVCache):
            raise TypeError(f"cache must be a KVCache or None, got {type(cache).__name__}")
        if cache is not None and not torch.compiler.is_compiling():
            with cache.in_use():  # another thread's call on this cache raises RuntimeError
                return self._forward(x, positions, key_padding_mask, segment_ids, cache)
        return self._forward(x, positions, key_padding_mask, segment_ids, cache)

    def _forward(
        self,
        x: Tensor,
        positions: Tensor | None,
        key_padding_mask: Tensor | None,
        segment_ids: Tensor | None,
        cache: KVCache | None,
    ) -> Tensor:
        """``forward`` after its checks of ``x`` and ``cache``."""
        batch, length, _ = x.shape
        past = 0 if cache is None else len(cache)
        _check_ids("key_padding_mask", key_padding_mask, [(batch, length), (batch, past + length)])
        _check_ids("segment_ids", segment_ids, [(batch, length)])
        rotary_pos = None  # structured positions (M-RoPE [3, B, T], axial [N, 2]) rotate only
        split = getattr(self.position, "attention_positions", None)
        if positions is not None and split is not None:
            positions, rotary_pos = split(positions, batch=batch, length=length)
        aligned = positions is None and past == 0 and key_padding_mask is None
        aligned = aligned and segment_ids is None
        if positions is None and cache is not None:
            q_pos = cache.next_positions(length, x.device)
        else:
            q_pos = resolve_positions(positions, length, batch=batch, device=x.device)
        q_pos = q_pos.to(x.device)
        if q_pos.dim() == 2:
            q_pos = q_pos.expand(batch, -1)

        q = self.q_proj(x).view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        gates = None  # WEIGHTS site: per-token gates from the layer's input, [B, H, T, G]
        if self.position.sites & Site.WEIGHTS:
            gates = self.position.gates(x, None if cache is None else cache.gates)
        where = (q_pos, rotary_pos, cache, key_padding_mask, segment_ids, aligned, gates)
        if self.attention_dtype is None:
            out = self._core(q, k, v, *where)
        else:
            with without_autocast(x.device.type):
                q, k, v = (t.to(self.attention_dtype) for t in (q, k, v))
                out = self._core(q, k, v, *where).to(x.dtype)
        return self.out_proj(out.transpose(1, 2).reshape(batch, length, self.d_model))

    def _core(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        q_pos: Tensor,
        rotary_pos: Tensor | None,
        cache: KVCache | None,
        key_padding_mask: Tensor | None,
        segment_ids: Tensor | None,
        aligned: bool,
        gates: Tensor | None,
    ) -> Tensor:
        """Rotation, cache and attention of ``q [B, H, T, D]``, ``k, v [B, Hkv, T, D]``:
        ``[B, H, T, D]``."""
        batch = q.shape[0]
        if self.position.sites & Site.QK:
            r_pos = q_pos if rotary_pos is None else rotary_pos.to(q.device)
            if cache is None:
                q, k = self.position.rotate(q, k, r_pos, r_pos)  # [B, H, T, D], [B, Hkv, T, D]
            else:  # one frequency snapshot for the cached keys and the new q, k
                q, k = self.position.rotate_cached(q, k, r_pos, r_pos, cache)

        k_pos, k_mask, k_seg = q_pos, key_padding_mask, segment_ids
        if cache is not None:
            cache.append(
                k, v, q_pos, key_padding_mask=key_padding_mask, segment_ids=segment_ids,
                gates=gates,
            )  # fmt: skip
            k, v, k_pos, gates = cache.keys, cache.values, cache.positions, cache.gates
            k_mask, k_seg = cache.key_padding_mask, cache.segment_ids
        if k_pos.dim() != q_pos.dim():  # one of them per sequence: both [B, *]
            q_pos, k_pos = (p if p.dim() == 2 else p.expand(batch, -1) for p in (q_pos, k_pos))
        masking = Masking(self.causal, q_pos, k_pos, k_mask, segment_ids, k_seg, aligned=aligned)
        return attend(
            q,
            repeat_kv(k, self.num_heads),
            repeat_kv(v, self.num_heads),
            position=self.position,
            masking=masking,
            backend=self.backend,
            block_size=self.block_size,
            dropout_p=self.dropout if self.training else 0.0,
            gates=gates,
            sinks=self.sinks,
        )  # [B, H, T, D]

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, num_heads={self.num_heads}, "
            f"num_kv_heads={self.num_kv_heads}, causal={self.causal}, "
            f"backend={self.backend!r}, block_size={self.block_size}, dropout={self.dropout}"
            + ("" if self.attention_dtype is None else f", attention_dtype={self.attention_dtype}")
            + ("" if self.sinks is None else ", sinks=True")
        )
