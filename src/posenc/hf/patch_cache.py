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
import threading
import weakref
from typing import Any

import torch
from torch import Tensor, nn

from posenc.encodings.rotary.module import RotaryEmbedding

__all__ = ["CacheTracker", "TrackerPostHook", "TrackerPreHook"]


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


_CACHE_ARGUMENTS = ("cache", "past_key_values")  # transformers >= 5.24 and before


class CacheTracker:
    """Follows the caches a patched model fills (see the module docstring).

    The state of one forward (its cache, length before, positions) is per thread, so
    threads may share one patched model, each with its own cache; a deep copy of a
    patched model gets a fresh tracker of its own.

    Args:
        layer_types: the layer type of each decoder layer, or None when every layer uses
            the one rotary table.
        policy: ``"monotone"`` or ``"transformers"``.
    """

    def __init__(self, layer_types: list[str] | None, policy: str) -> None:
        self.layer_types, self.policy = layer_types, policy
        self._history: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # cache -> [B, N]
        self._rotations: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # layer -> dict
        self._local = threading.local()

    def __deepcopy__(self, memo: dict) -> CacheTracker:
        return CacheTracker(self.layer_types, self.policy)

    @property
    def _cache(self) -> Any:
        return getattr(self._local, "cache", None)

    @property
    def _before(self) -> int:
        return getattr(self._local, "before", 0)

    @property
    def _positions(self) -> Tensor | None:
        return getattr(self._local, "positions", None)

    def _type_of(self, index: int) -> str | None:
        return self.layer_types[index] if self.layer_types else None

    def _layers(self, cache: Any) -> list[tuple[int, Any]]:
        return list(enumerate(getattr(cache, "layers", [])))

    def start(self, cache: Any, rotary: nn.Module) -> None:
        """A forward begins on ``cache`` (None: no cache); a new sequence resets the
        monotone policy to the original frequencies."""
        self._local.cache, self._local.positions = cache, None
        self._local.before = int(cache.get_seq_length()) if cache is not None else 0
        if self.policy == "monotone" and self._local.before == 0:
            for encoding in rotary.encodings.values():
                encoding.reset_length()

    def observe(self, encoding: RotaryEmbedding, layer_type: str | None, positions: Tensor) -> None:
        """Run the length policy for one rotary table before this forward's rotations."""
        self._local.positions = positions
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

    def finish(self, output: Any, rotary: nn.Module) -> None:
        """A forward ended: append its positions to its cache's history and record the
        frequencies its new keys were rotated with."""
        cache = getattr(output, "past_key_values", None)
        cache = self._cache if cache is None else cache
        positions, self._local.cache = self._positions, None
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


class TrackerPreHook:
    """Base-model forward pre-hook (``with_kwargs=True``): finds the cache argument.

    A callable object rather than a closure, so that a deep copy of the model gets hooks
    that hold the copy's tracker and rotary module."""

    def __init__(self, tracker: CacheTracker, signature: inspect.Signature, rotary: nn.Module):
        self.tracker, self.signature, self.rotary = tracker, signature, rotary

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        arguments = self.signature.bind_partial(*args, **kwargs).arguments
        extra = arguments.get("kwargs", {})
        cache = next(
            (
                found
                for name in _CACHE_ARGUMENTS
                for found in (arguments.get(name), extra.get(name))
                if found is not None
            ),
            None,
        )
        self.tracker.start(cache, self.rotary)


class TrackerPostHook:
    """Base-model forward hook: records what the forward added to its cache."""

    def __init__(self, tracker: CacheTracker, rotary: nn.Module) -> None:
        self.tracker, self.rotary = tracker, rotary

    def __call__(self, module: nn.Module, args: tuple, output: Any) -> None:
        self.tracker.finish(output, self.rotary)
