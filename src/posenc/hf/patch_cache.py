"""The KV-cache side of ``posenc.hf.patch``: what a transformers cache holds, and the
monotone length policy's recomputation.

Shapes: ``B`` batch, ``N`` cached length, ``n`` new tokens. ``CacheTracker`` records, per
cache, the ``position_ids [B | 1, N]`` and the inputs (``input_ids [B, N]`` or
``inputs_embeds [B, N, C]``) of every forward that filled it.

Under the ``"monotone"`` policy a length-dependent scaling (dynamic NTK, LongRoPE; Peng et
al. 2023 sec. 3.2, Ding et al. 2024) follows the longest length seen. When a cached forward
reaches a length whose frequencies differ from those the cache was filled with, the whole
cache is recomputed first: the base model runs once more over the recorded inputs with the
new frequencies into a fresh cache, whose layers then replace the user's cache's in place.
Re-rotating the cached keys alone is exact for one layer only: from the second layer on, the
cached keys and values were computed from hidden states that attended with the old
frequencies. So every decoding step equals a full forward over the whole sequence, at the
price of one prefill each time the frequencies change (every step past the original length
with dynamic NTK, once with LongRoPE).
"""

from __future__ import annotations

import inspect
import threading
import weakref
from typing import Any

import torch
from torch import Tensor, nn

from posenc.encodings.rotary.module import RotaryEmbedding

__all__ = ["NOT_PICKLED", "CacheTracker", "TrackerPostHook", "TrackerPreHook"]

NOT_PICKLED = (
    "a model patched by posenc.hf.patch cannot be pickled; call posenc.hf.unpatch(model) "
    "first (save_pretrained saves its weights as they are)"
)
# the cache's name in forward arguments and in outputs: transformers >= 5.24, and before
_CACHE_ARGUMENTS = ("cache", "past_key_values")
_INPUTS = ("input_ids", "inputs_embeds")


class CacheTracker:
    """Follows the caches a patched model fills (see the module docstring).

    The state of one forward (its cache, length before, positions, inputs) is per thread,
    so threads may share one patched model, each with its own cache; a deep copy of a
    patched model gets a fresh tracker of its own. With a length-dependent table the
    frequencies live in the shared rotary modules, so forwards take turns (a lock held
    from ``start`` to ``finish``, which runs even when the forward raises), and under the
    monotone policy each forward starts from the frequencies of its own cache (the
    longest length its recorded positions reach), not from another sequence's.

    Args:
        policy: ``"monotone"`` or ``"transformers"``.
        length_dependent: whether any rotary table of the model depends on the length
            (dynamic NTK, LongRoPE). Positions and inputs are recorded only when a cache
            may need recomputing (``"monotone"`` and length-dependent): otherwise a forward
            adds no work.
    """

    def __init__(self, policy: str, length_dependent: bool) -> None:
        self.policy, self.length_dependent = policy, length_dependent
        self.recording = policy == "monotone" and length_dependent
        self._history: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # cache -> [B, N]
        self._inputs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # cache -> (name, x)
        self._local = threading.local()
        self._turn = threading.RLock()  # start to finish; a recomputing forward skips both

    def __deepcopy__(self, memo: dict) -> CacheTracker:
        return CacheTracker(self.policy, self.length_dependent)

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError(NOT_PICKLED)

    def _get(self, name: str, default: Any = None) -> Any:
        return getattr(self._local, name, default)

    @property
    def nested(self) -> bool:
        """Inside the recomputation of a cache (the hooks stand aside)."""
        return self._get("nested", False)

    def start(self, cache: Any, inputs: tuple[str, Tensor] | None, rotary: nn.Module) -> None:
        """A forward begins on ``cache`` (None: no cache) with ``inputs``; a new sequence
        resets the monotone policy to the original frequencies, a cached one returns to
        the frequencies its cache was filled with."""
        if self.length_dependent and not self._get("turn", False):
            self._turn.acquire()  # released by finish()
            self._local.turn = True
        self._local.cache, self._local.positions, self._local.inputs = cache, None, inputs
        self._local.before = int(cache.get_seq_length()) if cache is not None else 0
        if self.policy != "monotone":
            return
        history = self._history.get(cache) if self.recording and self._local.before else None
        if self._local.before == 0 or history is not None:
            reached = int(history.max()) + 1 if history is not None else 0
            for encoding in rotary.encodings.values():
                if encoding.seen_length != reached:
                    encoding.reset_length()
                    encoding.observe_length(reached)

    def must_recompute(self, rotary: nn.Module, length: int) -> bool:
        """Whether a forward reaching ``length`` changes the frequencies of a non-empty
        cache under the monotone policy (the lengths are advanced as a side effect)."""
        if not self.recording or self._get("before", 0) == 0:
            return False
        changes = [encoding.observe_length(length) for encoding in rotary.encodings.values()]
        return any(change is not None for change in changes)

    def recorded(self, cache: Any) -> tuple[Tensor, tuple[str, Tensor]]:
        """The positions ``[B | 1, N]`` and inputs that filled ``cache``.

        Raises:
            ValueError: the cache was filled before the patch (or without inputs).
        """
        history, inputs = self._history.get(cache), self._inputs.get(cache)
        if history is None or inputs is None:
            raise ValueError(
                "the KV cache was filled before posenc.hf.patch; its inputs are unknown, so it "
                "cannot be recomputed with the new frequencies: start a new cache"
            )
        return history, inputs

    def observe(self, encoding: RotaryEmbedding, layer_type: str | None, positions: Tensor) -> None:
        """Run the length policy for one rotary table before this forward's rotations."""
        self._local.positions = positions
        if not encoding.scaling.length_dependent or positions.numel() == 0:
            return
        change = encoding.observe_length(int(positions.max()) + 1)
        stale = self.recording and self._get("before", 0) > 0 and not self.nested
        if change is not None and stale:
            raise ValueError(
                "the frequencies changed inside a cached forward that was not recomputed "
                "(positions past those the forward's inputs imply); start a new cache"
            )

    def finish(self, output: Any) -> None:
        """A forward ended (``output`` None: it raised): append its positions and inputs
        to its cache's record, and let the next forward take its turn."""
        try:
            if output is not None:
                self._record(output)
        finally:
            self._local.cache = None
            if self._get("turn", False):
                self._local.turn = False
                self._turn.release()

    def _record(self, output: Any) -> None:
        fields = getattr(output, "__dataclass_fields__", {})  # a transformers ModelOutput
        name = next((n for n in _CACHE_ARGUMENTS if n in fields), None)
        cache = getattr(output, name) if name else None
        cache = self._get("cache") if cache is None else cache
        positions, inputs = self._get("positions"), self._get("inputs")
        if not self.recording or cache is None or positions is None or inputs is None:
            return
        new = positions.to("cpu", torch.long)
        old, before = self._history.get(cache), self._get("before", 0)
        if old is not None and before:
            old = old[:, :before]
            batch = max(old.shape[0], new.shape[0])
            new = torch.cat((old.expand(batch, -1), new.expand(batch, -1)), dim=-1)
            name, kept = self._inputs[cache]
            if name != inputs[0]:
                raise ValueError(
                    f"a cached forward with {inputs[0]} after one with {name}: posenc.hf.patch "
                    "records one kind of input per cache"
                )
            inputs = (name, torch.cat((kept[:, :before], inputs[1]), dim=1))
        self._history[cache] = new
        self._inputs[cache] = inputs


def _bound(signature: inspect.Signature, args: tuple, kwargs: dict) -> dict[str, Any]:
    arguments = signature.bind_partial(*args, **kwargs).arguments
    return {**arguments.pop("kwargs", {}), **arguments}


class TrackerPreHook:
    """Base-model forward pre-hook (``with_kwargs=True``): finds the cache and the inputs,
    and recomputes the cache when the monotone policy changes the frequencies.

    A callable object rather than a closure, so that a deep copy of the model gets hooks
    that hold the copy's tracker and rotary module."""

    def __init__(self, tracker: CacheTracker, signature: inspect.Signature, rotary: nn.Module):
        self.tracker, self.signature, self.rotary = tracker, signature, rotary

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if self.tracker.nested:
            return
        arguments = _bound(self.signature, args, kwargs)
        name = next((n for n in _CACHE_ARGUMENTS if arguments.get(n) is not None), None)
        cache = arguments.get(name) if name else None
        kind = next((n for n in _INPUTS if arguments.get(n) is not None), None)
        inputs = (kind, arguments[kind].detach()) if kind else None
        self.tracker.start(cache, inputs, self.rotary)
        if cache is None or inputs is None:
            return
        positions = arguments.get("position_ids")
        before = int(cache.get_seq_length())
        length = int(positions.max()) + 1 if positions is not None else before + inputs[1].shape[1]
        if self.tracker.must_recompute(self.rotary, length):
            self._recompute(module, arguments, name, cache, before)

    def _recompute(
        self, module: nn.Module, arguments: dict, name: str, cache: Any, before: int
    ) -> None:
        history, (kind, inputs) = self.tracker.recorded(cache)
        mask = arguments.get("attention_mask")
        if mask is not None and mask.dim() != 2:
            raise ValueError(
                f"a {mask.dim()}-D attention_mask: posenc.hf.patch recomputes a cache with "
                "2-D masks only; use length_policy='transformers' or a 2-D mask"
            )
        try:
            fresh = type(cache)(config=module.config)
        except TypeError as exc:
            raise ValueError(
                f"cannot recompute a {type(cache).__name__} with new frequencies; use a "
                "DynamicCache"
            ) from exc
        batch = inputs.shape[0]
        self.tracker._local.nested = True
        try:
            with torch.no_grad():
                module(
                    **{kind: inputs[:, :before], name: fresh},
                    attention_mask=None if mask is None else mask[:, :before],
                    position_ids=history[:, :before].to(inputs.device).expand(batch, -1),
                    use_cache=True,
                )
        finally:
            self.tracker._local.nested = False
        cache.__dict__.update(fresh.__dict__)  # the user's cache object, recomputed layers


class TrackerPostHook:
    """Base-model forward hook (``always_call=True``): records what the forward added to
    its cache, and ends the forward's turn even when it raised."""

    def __init__(self, tracker: CacheTracker) -> None:
        self.tracker = tracker

    def __call__(self, module: nn.Module, args: tuple, output: Any) -> None:
        if not self.tracker.nested:
            self.tracker.finish(output)
