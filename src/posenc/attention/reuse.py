"""What an encoding computes from its parameters alone, kept for the next call.

The offset table of ALiBi, T5, KERPLE and Sandwich (``posenc.attention.blocks``) and
FIRE's FlexAttention tables (``posenc.attention.flex``) depend on the encoding's state
and the call's shape, not on the queries or keys; an encoding that serves many layers,
or one layer over many steps at one length, builds them once. ``EncodingCache`` keeps the
last one per encoding and rebuilds it when anything it may depend on changed.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from posenc.base import PositionalEncoding

__all__ = ["EncodingCache"]


class EncodingCache:
    """The last value built for each encoding, reused while its key is unchanged.

    The key holds the call's ``shape`` (any hashable description of it), the identity and
    version counter (bumped by every in-place change, an optimizer step included) of every
    parameter, buffer and tensor attribute of the encoding, and its plain attributes. A
    value that gradients flow through is never kept, nor one built under
    ``torch.compile``, nor one of an encoding whose tensors keep no version counter
    (inference tensors)."""

    def __init__(self) -> None:
        self._last: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def get(self, position: PositionalEncoding, shape: Any, build: Callable[[], Any]) -> Any:
        """The value of ``build()`` for ``position`` at ``shape``, built or kept."""
        key = _key(position, shape)
        if key is None:
            return build()
        last = self._last.get(position)
        if last is not None and last[0] == key[0]:
            return last[2]
        value = build()
        self._last[position] = (key[0], key[1], value)  # key[1]: no identity is reused
        return value

    def __contains__(self, position: PositionalEncoding) -> bool:
        return position in self._last

    def forget(self, position: PositionalEncoding) -> None:
        """Drop what is kept for ``position``."""
        self._last.pop(position, None)


def _key(position: PositionalEncoding, shape: Any) -> tuple[tuple, tuple] | None:
    """``(key, tensors)`` for ``position`` at ``shape``, or None when nothing may be kept."""
    if torch.compiler.is_compiling():
        return None
    attrs = vars(position)
    held = (v for v in attrs.values() if isinstance(v, Tensor))  # e.g. ALiBi's slopes
    tensors = tuple(itertools.chain(position.parameters(), position.buffers(), held))
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return None
    try:
        state = tuple((id(t), t._version) for t in tensors)
    except RuntimeError:  # an inference tensor keeps no version counter
        return None
    plain = tuple((n, v) for n, v in attrs.items() if isinstance(v, (bool, int, float, str)))
    return (shape, state, plain), tensors
