"""The KV-cache side of ``posenc.hf.patch``: which positions a transformers cache holds,
which frequencies rotated its keys, and the monotone length policy's re-rotation.

Shapes: ``B`` batch, ``Hkv`` key heads, ``T`` cached length, ``D`` head_dim. A transformers
``DynamicCache`` keeps one layer object per decoder layer whose ``keys`` are ``[B, Hkv, T,
D]`` (a sliding-window layer keeps the last ``T`` of them). ``CacheTracker`` records, per
cache, the ``position_ids`` of every forward that filled it (so left padding and sliding
windows are handled), and per cache layer the frequencies its keys were rotated with; the
monotone policy hands each layer to ``RotaryEmbedding.sync_cache`` through ``_LayerView``,
which re-rotates its keys (``posenc.rerotate_keys``) when the frequencies changed.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from posenc.encodings.rotary.module import RotaryEmbedding

__all__ = ["CacheTracker"]


class _LayerView:
    """One transformers cache layer seen as a posenc cache (``keys``, ``positions``,
    ``rotations``, ``len``) by ``RotaryEmbedding.sync_cache``."""

    def __init__(self, layer: Any, history: Tensor, rotations: dict) -> None:
        self.layer, self.rotations = layer, rotations
        length = len(self)
        if length > history.shape[-1]:
            raise ValueError(
                f"cannot re-rotate the keys of a {type(layer).__name__}: it holds {length} "
                f"positions but {history.shape[-1]} were seen; use a DynamicCache"
            )
        batch = layer.keys.shape[0] if length else 1
        tail = history[:, history.shape[-1] - length :]  # [1 | B, T]
        self.positions = tail[0] if tail.shape[0] == 1 else tail.expand(batch, -1)

    def __len__(self) -> int:
        keys = getattr(self.layer, "keys", None)
        return 0 if keys is None or keys.numel() == 0 else keys.shape[-2]

    @property
    def keys(self) -> Tensor:
        return self.layer.keys

    @keys.setter
    def keys(self, value: Tensor) -> None:
        self.layer.keys = value


class CacheTracker:
    """Follows the caches a patched model fills (see the module docstring).

    Args:
        layer_types: the layer type of each decoder layer, or None when every layer uses
            the one rotary table.
        policy: ``"monotone"`` or ``"transformers"``.
    """

    def __init__(self, layer_types: list[str] | None, policy: str) -> None:
        self.layer_types, self.policy = layer_types, policy
        self._history: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # cache -> [B, N]
        self._rotations: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # layer -> dict
        self._cache: Any = None
        self._before = 0
        self._positions: Tensor | None = None

    def _type_of(self, index: int) -> str | None:
        return self.layer_types[index] if self.layer_types else None

    def _layers(self, cache: Any) -> list[tuple[int, Any]]:
        return list(enumerate(getattr(cache, "layers", [])))

    def pre_hook(self, signature: inspect.Signature, rotary: nn.Module) -> Callable:
        """Base-model forward pre-hook: find the cache; a new sequence resets the monotone
        policy to the original frequencies."""

        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            cache = signature.bind_partial(*args, **kwargs).arguments.get("past_key_values")
            self._cache, self._positions = cache, None
            self._before = int(cache.get_seq_length()) if cache is not None else 0
            if self.policy == "monotone" and self._before == 0:
                for encoding in rotary.encodings.values():
                    encoding.reset_length()

        return hook

    def observe(self, encoding: RotaryEmbedding, layer_type: str | None, positions: Tensor) -> None:
        """Run the length policy for one rotary table before this forward's rotations."""
        self._positions = positions
        if not encoding.scaling.length_dependent or positions.numel() == 0:
            return
        length = int(positions.max()) + 1
        encoding.observe_length(length)
        cache = self._cache
        if self.policy != "monotone" or cache is None or self._before == 0:
            return
        history = self._history.get(cache)
        if history is None:
            raise ValueError(
                "the KV cache was filled before posenc.hf.patch; its keys' positions are "
                "unknown, so they cannot be re-rotated: start a new cache"
            )
        history = history[:, : self._before]
        for index, layer in self._layers(cache):
            if self._type_of(index) == layer_type:
                view = _LayerView(layer, history, self._rotations.setdefault(layer, {}))
                encoding.sync_cache(view, length)

    def post_hook(self, rotary: nn.Module) -> Callable:
        """Base-model forward hook: append this forward's positions to its cache's
        history and record the frequencies its new keys were rotated with."""

        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            cache = getattr(output, "past_key_values", None)
            cache = self._cache if cache is None else cache
            positions, self._cache = self._positions, None
            if cache is None or positions is None:
                return
            old = self._history.get(cache)
            new = positions.to("cpu", torch.long)
            if old is not None and self._before:
                old = old[:, : self._before]
                batch = max(old.shape[0], new.shape[0])
                new = torch.cat((old.expand(batch, -1), new.expand(batch, -1)), dim=-1)
            self._history[cache] = new
            for index, layer in self._layers(cache):
                encoding = rotary.encodings[str(self._type_of(index))]
                frequencies = (encoding.inv_freq, encoding.attention_scale)
                self._rotations.setdefault(layer, {})[id(encoding)] = frequencies

        return hook
