"""The one abstraction: a positional encoding acts at one or more *sites*.

Shape letters used throughout posenc: ``B`` batch, ``H`` query heads, ``Hkv`` key/value
heads, ``T`` length (``Tq`` queries, ``Tk`` keys), ``D`` head_dim, ``C`` d_model.

======== ============================================================ =====================
site     hook                                                         examples
======== ============================================================ =====================
INPUT    ``embed(x [B, T, C], positions) -> [B, T, C]``               sinusoidal, learned
QK       ``rotate(q [B, H, Tq, D], k [B, Hkv, Tk, D], q_pos, k_pos)`` RoPE, xPos
SCORE    ``score_bias(q, k, q_pos, k_pos) -> [B|1, H, Tq, Tk]``       ALiBi, T5, FIRE, CoPE
VALUE    ``value_term(probs [B, H, Tq, Tk], q_pos, k_pos) -> [B, H, Tq, D]``  Shaw (values)
WEIGHTS  ``gates(x [B, T, C], past)``, ``weights(q, k, q_pos, k_pos, ...)``  FoX, stick-breaking
======== ============================================================ =====================

Positions are explicit tensors of shape ``[T]`` or ``[B, T]`` (integer or float, never
bf16/fp16), except for the encodings that declare structured positions
(``PositionalEncoding.position_shape``: M-RoPE's ``[A, T]``, axial RoPE's ``[N, A]``).
``MultiHeadAttention`` calls the hooks and never needs to know which encoding it holds;
for KV-cache decoding ``rotate`` sees only the new keys (cached keys are stored already
rotated), while ``score_bias`` and ``value_term`` see every cached key (``k`` expanded
to ``H`` heads) and may be called once per query block.

WEIGHTS encodings compute the attention weights themselves (data-dependent attention:
forget gates, stick-breaking) from ``q``, ``k`` and per-token *gates* that ``gates``
computes from the layer's input ``x`` (cached beside the keys); ``weights`` replaces the
scaled dot product and the softmax (``posenc.attention.blocks.weights_block``).
"""

from __future__ import annotations

import enum
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import torch
from torch import Tensor, nn

__all__ = [
    "POSITION_SHAPES",
    "Compose",
    "EncodingInfo",
    "PositionalEncoding",
    "Site",
    "available",
    "build",
    "info",
    "register",
]


class Site(enum.Flag):
    """Where an encoding acts inside attention (combinable: ``Site.QK | Site.SCORE``)."""

    NONE = 0
    INPUT = enum.auto()
    QK = enum.auto()
    SCORE = enum.auto()
    VALUE = enum.auto()
    WEIGHTS = enum.auto()

    def names(self) -> list[str]:
        """Lower-case names of the member sites, in hook order."""
        order = (Site.INPUT, Site.QK, Site.SCORE, Site.VALUE, Site.WEIGHTS)
        return [s.name.lower() for s in order if s & self]


#: The positions an encoding's hooks may take (``PositionalEncoding.position_shape``):
#: token positions; each token's position on ``A`` axes, M-RoPE's time, height and width
#: for three (Wang et al. 2024, Qwen2-VL); the coordinates of ``N`` patches on ``A`` axes,
#: ``(y, x)`` for two (Heo et al. 2024, RoPE for ViT).
POSITION_SHAPES = ("[T]", "[A, T]", "[N, A]")


class PositionalEncoding(nn.Module):
    """Base class of every encoding. Subclasses set ``sites`` and override its hooks.

    The default hooks are identities (``embed``, ``rotate``) or ``None`` (``score_bias``,
    ``value_term``), so an encoding only writes the hooks of its own sites.

    Class attributes:
        sites: the sites the encoding acts at.
        causal_only: True when the encoding is only defined under a causal mask (CoPE).
        offset_only: True when ``score_bias`` depends on ``q_pos - k_pos`` alone (not on
            ``q``, ``k`` or the positions themselves), so attention may evaluate it once
            per offset (ALiBi, T5, KERPLE, Sandwich).
        position_shape: the positions the hooks take, one of ``POSITION_SHAPES``:

            * ``"[T]"`` (the default): token positions ``[T]`` or ``[B, T]``;
            * ``"[A, T]"``: positions on ``A`` axes, ``[A, T]`` or ``[A, B, T]`` (M-RoPE's
              time, height, width); token positions ``[T]`` / ``[B, T]`` are text, equal
              on the axes;
            * ``"[N, A]"``: patch coordinates on ``A`` axes (``(y, x)`` for two), ``[N, A]``
              or ``[B, N, A]`` (axial RoPE), ``N`` the tokens after any unrotated prefix.

            An encoding with structured positions (not ``"[T]"``) also defines
            ``attention_positions(positions, *, batch, length) -> (token, rotary)``:
            ``MultiHeadAttention`` hands it the positions it was given and rotates at
            ``rotary`` (when not None), ordering (masking, caching) the tokens by ``token``,
            or by their index when ``token`` is None. ``register`` checks the declaration.
    """

    sites: ClassVar[Site] = Site.NONE
    causal_only: ClassVar[bool] = False
    offset_only: ClassVar[bool] = False
    positional_bias: ClassVar[bool] = False
    position_shape: ClassVar[str] = "[T]"

    def forward(
        self, q: Tensor, k: Tensor, positions: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """The call of every encoding that acts on queries and keys (QK site):
        ``enc(q, k, positions=None) -> (q, k)`` for ``q [B, H, Tq, D]``, ``k [B, Hkv, Tk, D]``.

        ``positions`` are shared by ``q`` and ``k`` (``Tq == Tk``), shaped as the encoding's
        ``position_shape``; None means token indices ``0..Tk-1``, the queries being the last
        ``Tq`` of them (not available for patch coordinates ``[N, A]``). Score biases are
        asked for with ``bias`` (``score_bias`` for content-dependent ones).

        Raises:
            TypeError: the encoding does not act on queries and keys (the message says what
                to call instead).
            ValueError: ``q``/``k`` not 4-D; ``Tq != Tk`` with positions, ``Tq > Tk``
                without; no positions for an encoding that needs them; see ``rotate``.
        """
        name = type(self).__name__
        if not self.sites & Site.QK:
            sites = "|".join(self.sites.names()) or "none"
            raise TypeError(
                f"{name} does not transform queries and keys (sites: {sites}); "
                + _other_calls(self)
            )
        for label, x in (("q", q), ("k", k)):
            if not isinstance(x, Tensor) or x.dim() != 4:
                shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
                raise ValueError(f"{label} must be a 4-D tensor [B, H, T, D], got {shape}")
        t_q, t_k = q.shape[-2], k.shape[-2]
        if positions is not None:
            if t_q != t_k:
                raise ValueError(f"positions are shared, but q has T={t_q} and k has T={t_k}")
            return self.rotate(q, k, positions, positions)
        if self.position_shape == "[N, A]":
            raise ValueError(f"{name} needs positions {self.position_shape} (patch coordinates)")
        check_token_axis(q, k, fix="transpose them to [B, H, T, D]")
        k_pos = torch.arange(t_k, device=k.device)
        return self.rotate(q, k, k_pos[t_k - t_q :], k_pos)

    def bias(
        self,
        q_len: int,
        k_len: int | None = None,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> Tensor:
        """SCORE site without queries and keys: the bias ``[1, H, Tq, Tk]`` of keys at
        ``0..Tk-1`` and queries at the last ``Tq`` of them (``k_len`` defaults to ``q_len``),
        for encodings whose bias depends on positions only (``offset_only`` or
        ``positional_bias``: ALiBi, T5, KERPLE, Sandwich, FIRE). ``device`` defaults to the
        encoding's parameters' (the CPU without any).

        Raises:
            TypeError: the encoding has no position-only bias (the message says what to
                call instead); non-integer lengths.
            ValueError: lengths below 1.
        """
        if not (self.sites & Site.SCORE and (self.offset_only or self.positional_bias)):
            raise TypeError(
                f"{type(self).__name__} has no bias of positions alone; " + _other_calls(self)
            )
        q_len, k_len = _length("q_len", q_len), _length("k_len", q_len if k_len is None else k_len)
        if device is None:
            param = next(iter(self.parameters()), None)
            device = param.device if param is not None else "cpu"
        heads = self.num_heads
        q = torch.zeros(1, heads, q_len, 1, dtype=dtype, device=device)
        k = torch.zeros(1, heads, k_len, 1, dtype=dtype, device=device)
        k_pos = torch.arange(k_len, device=device)
        q_pos = torch.arange(k_len - q_len, k_len, device=device)
        return self.score_bias(q, k, q_pos, k_pos)

    def embed(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        """INPUT site: ``x [B, T, C]`` with ``positions [T] | [B, T]`` -> ``[B, T, C]``."""
        return x

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        """QK site: transform ``q [B, H, Tq, D]`` and ``k [B, Hkv, Tk, D]``."""
        return q, k

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        """SCORE site: additive logits bias ``[B|1, H, Tq, Tk]`` (None: no bias).

        ``q [B, H, Tq, D]`` and ``k [B, H, Tk, D]`` are the (already rotated, scaled by
        nothing) queries and keys, for encodings whose bias depends on content.
        """
        return None

    def value_term(self, probs: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        """VALUE site: a term ``[B, H, Tq, D]`` added to ``probs @ v`` (None: nothing)."""
        return None

    def gates(self, x: Tensor, past: Tensor | None = None) -> Tensor:
        """WEIGHTS site: per-token gates ``[B, H, T, G]`` of the new tokens ``x [B, T, C]``.

        ``past``: the gates of the cached tokens ``[B, H, Tk, G]`` (None without a cache),
        for gates that accumulate along the sequence. ``MultiHeadAttention`` caches what
        this returns and hands every key's gates to ``weights``.
        """
        raise NotImplementedError(f"{type(self).__name__} has no WEIGHTS site")

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
        """WEIGHTS site: attention weights ``[B, H, Tq, Tk]`` (zero where not visible).

        ``q [B, H, Tq, D]``, ``k [B, H, Tk, D]`` (keys in storage order), their positions,
        their gates (``[B, H, Tq, G]``, ``[B, H, Tk, G]``) and an optional bool ``mask``
        ``[B|1, 1, Tq, Tk]`` (True = visible; padding and segments) replace the softmax
        of ``q k^T / sqrt(D)``.
        """
        raise NotImplementedError(f"{type(self).__name__} has no WEIGHTS site")

    def sync_cache(self, cache: Any, length: int) -> None:
        """Make the keys of a KV cache consistent with a forward reaching ``length``.

        ``MultiHeadAttention`` calls this before a cached forward whose positions reach
        ``length - 1``. Encodings whose rotation depends on the sequence length (dynamic
        NTK, LongRoPE) choose their frequencies for ``length`` here and re-rotate the
        cached keys (``cache.keys``, stored rotated) so every key matches the new queries.
        The default does nothing.
        """

    def rotate_cached(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, cache: Any
    ) -> tuple[Tensor, Tensor]:
        """QK site in a cached forward: ``sync_cache`` for ``max(q_pos) + 1``, then ``rotate``.

        ``MultiHeadAttention`` calls this instead of ``rotate`` when it holds a KV cache.
        Encodings with frequency state (RoPE) override it to use one snapshot of that state
        for the cached keys and the new queries and keys, so that threads sharing the
        encoding cannot interleave between the two steps.
        """
        if q_pos.numel():
            self.sync_cache(cache, int(q_pos.max()) + 1)
        return self.rotate(q, k, q_pos, k_pos)

    def extra_repr(self) -> str:
        return f"sites={'|'.join(self.sites.names()) or 'none'}"


class Compose(PositionalEncoding):
    """Several encodings at once, e.g. ``Compose([RotaryEmbedding(64), ALiBi(8)])``.

    Hooks are applied in list order: ``embed`` and ``rotate`` chain, score biases and
    value terms add up.

    Structured positions: the parts may declare one ``position_shape`` besides ``"[T]"``
    (two M-RoPEs share their ``[A, T]`` positions), which is then the composition's, with
    the ``attention_positions`` of its first such part. ``rotate`` hands structured
    positions to the parts that declare them and the tokens' indices to the others: ``0..T-1``,
    or, in ``rotate_cached``, continuing after the cache's last position, as
    ``MultiHeadAttention`` orders the tokens; so ``Compose([MRoPE(...),
    PositionTemperature(...)])`` rotates at ``[3, B, T]`` and scales queries by index. Token
    positions that a structured part reads as text (M-RoPE's ``[T]`` / ``[B, T]``) reach
    every part as they are.

    WEIGHTS encodings compute the whole attention and are not composed.

    Raises:
        TypeError: an item that is not a ``PositionalEncoding``; a structured part without
            ``attention_positions``.
        ValueError: no encodings; parts that need different structured positions (named);
            a WEIGHTS-site part.
    """

    def __init__(self, encodings: Iterable[PositionalEncoding]) -> None:
        super().__init__()
        if isinstance(encodings, (PositionalEncoding, str, bytes)) or not isinstance(
            encodings, Iterable
        ):
            raise TypeError(
                "Compose expects a list of PositionalEncoding modules as encodings, got "
                f"{type(encodings).__name__}"
            )
        encodings = list(encodings)
        for i, enc in enumerate(encodings):
            if not isinstance(enc, PositionalEncoding):
                raise TypeError(
                    f"Compose expects PositionalEncoding modules, item {i} is {type(enc).__name__}"
                )
        if not encodings:
            raise ValueError("Compose needs at least one encoding, got an empty list")
        for i, enc in enumerate(encodings):
            if enc.sites & Site.WEIGHTS:
                raise ValueError(
                    f"Compose item {i} ({type(enc).__name__}) computes the attention weights "
                    "itself (WEIGHTS site) and cannot be composed"
                )
        structured = [(i, e) for i, e in enumerate(encodings) if e.position_shape != "[T]"]
        for i, enc in structured:
            if not callable(getattr(enc, "attention_positions", None)):
                raise TypeError(
                    f"Compose item {i} ({type(enc).__name__}) declares positions "
                    f"{enc.position_shape} but has no attention_positions method"
                )
        if len({e.position_shape for _, e in structured}) > 1:
            parts = ", ".join(
                f"{type(e).__name__} (item {i}) {e.position_shape}" for i, e in structured
            )
            raise ValueError(
                f"Compose parts need different structured positions: {parts}; attention "
                "hands one positions tensor to the composition"
            )
        self.encodings = nn.ModuleList(encodings)
        self._structured_at = structured[0][0] if structured else None

    @property
    def _structured(self) -> PositionalEncoding | None:
        """The first part with structured positions (None: every part takes ``[T]``)."""
        at = self._structured_at
        return None if at is None else self.encodings[at]

    @property
    def sites(self) -> Site:  # type: ignore[override]
        out = Site.NONE
        for enc in self.encodings:
            out |= enc.sites
        return out

    @property
    def causal_only(self) -> bool:  # type: ignore[override]
        return any(enc.causal_only for enc in self.encodings)

    @property
    def position_shape(self) -> str:  # type: ignore[override]
        return "[T]" if self._structured is None else self._structured.position_shape

    def attention_positions(
        self, positions: Tensor, *, batch: int, length: int
    ) -> tuple[Tensor | None, Tensor | None]:
        """Split the positions given to ``MultiHeadAttention``: ``(token, rotary)``, as the
        first structured part splits them; ``(positions, None)`` without such a part."""
        if self._structured is None:
            return positions, None
        return self._structured.attention_positions(positions, batch=batch, length=length)

    def embed(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        for enc in self.encodings:
            if enc.sites & Site.INPUT:
                x = enc.embed(x, positions)
        return x

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        """Chain the parts' ``rotate``, each at its positions (see the class docstring).

        Raises:
            ValueError: positions a structured part refuses (its own message).
        """
        return self._rotate(q, k, q_pos, k_pos, None)

    def sync_cache(self, cache: Any, length: int) -> None:
        for enc in self._at(Site.QK):
            enc.sync_cache(cache, length)

    def rotate_cached(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, cache: Any
    ) -> tuple[Tensor, Tensor]:
        return self._rotate(q, k, q_pos, k_pos, cache)

    def _rotate(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, cache: Any
    ) -> tuple[Tensor, Tensor]:
        q_tok, k_tok = (
            self._token_positions(q, q_pos, cache),
            self._token_positions(k, k_pos, cache),
        )
        for enc in self._at(Site.QK):
            pos = (q_tok, k_tok) if enc.position_shape == "[T]" else (q_pos, k_pos)
            if cache is None:
                q, k = enc.rotate(q, k, *pos)
            else:
                q, k = enc.rotate_cached(q, k, *pos, cache)
        return q, k

    def _token_positions(self, x: Tensor, positions: Tensor, cache: Any) -> Tensor:
        """The positions of the ``"[T]"`` parts for the tokens of ``x [B, H, T, D]``."""
        if self._structured is None:
            return positions
        batch, length = x.shape[0], x.shape[-2]
        token, rotary = self.attention_positions(positions, batch=batch, length=length)
        if rotary is None:
            return token
        if cache is None:
            return torch.arange(length, device=x.device)
        return cache.next_positions(length, x.device)

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        return _sum_terms(e.score_bias(q, k, q_pos, k_pos) for e in self._at(Site.SCORE))

    def bias(
        self,
        q_len: int,
        k_len: int | None = None,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> Tensor:
        """The sum of the parts' ``bias`` (see ``PositionalEncoding.bias``).

        Raises:
            TypeError: no part with a bias, or a part whose bias needs queries and keys.
        """
        parts = self._at(Site.SCORE)
        if not parts:
            raise TypeError(f"this Compose has no score bias; {_other_calls(self)}")
        return _sum_terms(e.bias(q_len, k_len, dtype=dtype, device=device) for e in parts)

    def value_term(self, probs: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        return _sum_terms(e.value_term(probs, q_pos, k_pos) for e in self._at(Site.VALUE))

    def _at(self, site: Site) -> list[PositionalEncoding]:
        return [enc for enc in self.encodings if enc.sites & site]


def check_token_axis(q: Tensor, k: Tensor, *, fix: str, offset: int = 0) -> None:
    """Refuse ``q``, ``k`` given without positions that cannot be ``[B, H, T, D]``, or that
    look like ``[B, T, H, D]``, whose head axis would be rotated as positions.

    ``[B, T, H, D]`` tensors share their length on axis 1. With grouped heads their axis 2
    (the heads) is longer in q than in k, which as ``[B, H, T, D]`` reads as queries longer
    than the keys; with equal heads, q and k have the same shape and ``T > H`` puts more
    on axis 1 than on axis 2. Both are refused, naming ``fix`` (how to give the other
    layout); ``[B, H, T, D]`` tensors with fewer tokens than heads then need positions,
    except for one token or at an ``offset`` (decode steps, ``[B, H, 1, D]``). Grouped
    ``[B, H, T, D]`` heads (axis 1 unequal) are never ambiguous.

    Raises:
        ValueError: the shapes, why they are ambiguous, and both ways out.
    """
    t_q, t_k = q.shape[2], k.shape[2]
    if t_q <= t_k and (t_q <= 1 or offset or q.shape[1] <= t_q or q.shape[1:3] != k.shape[1:3]):
        return  # the common case, decided before any message is formatted
    shapes = f"q {tuple(q.shape)} and k {tuple(k.shape)}"
    if t_q > t_k and q.shape[1] == k.shape[1]:
        raise ValueError(
            f"{shapes} as [B, H, T, D] have queries longer than the keys ({t_q} > {t_k}): "
            f"[B, T, H, D] tensors with grouped heads? {fix}; else pass positions"
        )
    if t_q > t_k:
        raise ValueError(f"q is longer than k ({t_q} > {t_k}); pass positions")
    if q.shape[1:3] == k.shape[1:3] and q.shape[1] > t_q > 1 and not offset:
        raise ValueError(
            f"{shapes} as [B, H, T, D] have more heads ({q.shape[1]}) than tokens ({t_q}): "
            f"[B, T, H, D] tensors? {fix}; for [B, H, T, D] pass positions "
            f"(torch.arange({t_q}))"
        )


def _length(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


def _other_calls(enc: PositionalEncoding) -> str:
    """What to call on ``enc`` instead of ``enc(q, k, positions=...)`` / ``enc.bias(T)``."""
    calls = []
    if enc.sites & Site.QK:
        calls.append("enc(q, k, positions=...)")
    if enc.sites & Site.SCORE:
        position_only = enc.offset_only or enc.positional_bias
        calls.append("enc.bias(T)" if position_only else "enc.score_bias(q, k, q_pos, k_pos)")
    if enc.sites & Site.INPUT:
        calls.append("enc.embed(x, positions)")
    if enc.sites & Site.VALUE:
        calls.append("enc.value_term(probs, q_pos, k_pos)")
    if enc.sites & Site.WEIGHTS:
        calls.append("enc.gates(x) and enc.weights(q, k, q_pos, k_pos, q_gates, k_gates)")
    if not calls:
        return "it leaves attention unchanged"
    return "call " + " or ".join(calls)


def _sum_terms(terms: Iterable[Tensor | None]) -> Tensor | None:
    total = None
    for term in terms:
        if term is not None:
            total = term if total is None else total + term
    return total


# --------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class EncodingInfo:
    """What ``posenc list`` shows about one registered encoding."""

    name: str
    cls: type[PositionalEncoding]
    paper: str
    description: str

    @property
    def sites(self) -> Site:
        return self.cls.sites

    @property
    def position_shape(self) -> str:
        return self.cls.position_shape


_REGISTRY: dict[str, EncodingInfo] = {}

#: Keyword arguments ``build`` drops when the encoding's constructor does not take them,
#: so that one call can build any encoding for a given model shape.
CONTEXT_KEYS = frozenset({"d_model", "num_heads", "head_dim", "max_len", "causal"})

E = TypeVar("E", bound=type[PositionalEncoding])


def register(name: str, *, paper: str, description: str) -> Callable[[E], E]:
    """Class decorator: make an encoding buildable by ``posenc.build(name)``.

    Raises:
        TypeError: a non-string ``name``, or decorating anything but a
            ``PositionalEncoding`` subclass.
        ValueError: ``name`` already registered to another class; a ``position_shape``
            not in ``POSITION_SHAPES``, or a structured one without ``attention_positions``.
    """
    if not isinstance(name, str):
        raise TypeError(f"encoding name must be a str, got {name!r}")

    def deco(cls: E) -> E:
        if not (isinstance(cls, type) and issubclass(cls, PositionalEncoding)):
            raise TypeError(
                f"register({name!r}) decorates PositionalEncoding subclasses, got {cls!r}"
            )
        if name in _REGISTRY and _REGISTRY[name].cls is not cls:
            raise ValueError(f"encoding name {name!r} is already registered")
        shape = cls.position_shape
        if shape not in POSITION_SHAPES:
            raise ValueError(
                f"{cls.__name__}.position_shape is {shape!r}; known: {', '.join(POSITION_SHAPES)}"
            )
        if shape != "[T]" and not callable(getattr(cls, "attention_positions", None)):
            raise ValueError(
                f"{cls.__name__} declares positions {shape} but no attention_positions method"
            )
        _REGISTRY[name] = EncodingInfo(name, cls, paper, description)
        return cls

    return deco


def available() -> list[str]:
    """Names of every registered encoding, sorted."""
    return sorted(_REGISTRY)


def info(name: str) -> EncodingInfo:
    """Registry entry for ``name``; unknown names raise ``ValueError`` listing the known."""
    if not isinstance(name, str):
        raise TypeError(f"encoding name must be a str, got {name!r} ({type(name).__name__})")
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown encoding {name!r}; known encodings: {', '.join(available())}"
        ) from None


def build(name: str, **kwargs: object) -> PositionalEncoding:
    """Build a registered encoding by name.

    Model-shape keywords (``d_model``, ``num_heads``, ``head_dim``, ``max_len``,
    ``causal``) are passed only to constructors that accept them, so
    ``build(name, d_model=256, num_heads=4, head_dim=64, max_len=128)`` works for every
    name. Any other keyword goes to the constructor as given.

    Raises:
        ValueError: unknown ``name`` (the message lists the known ones).
    """
    cls = info(name).cls
    own_init = cls.__init__ is not nn.Module.__init__
    params = inspect.signature(cls.__init__).parameters if own_init else {}
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    kept = {k: v for k, v in kwargs.items() if k not in CONTEXT_KEYS or k in params or takes_any}
    return cls(**kept)
