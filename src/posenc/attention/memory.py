"""Peak tensor memory of a computation, as counted by a dispatch mode (how the chunked
attention backend's ``O(B * H * block_size * Tk)`` bound is checked on CPU)."""

from __future__ import annotations

import weakref
from collections.abc import Callable

from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["peak_tensor_bytes"]


class _TensorMemory(TorchDispatchMode):
    """Dispatch mode that tracks the bytes of live tensor storages created by aten ops."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = self.largest = 0
        self._seen: set[int] = set()

    def _release(self, key: int, nbytes: int) -> None:
        self.live -= nbytes
        self._seen.discard(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if not isinstance(t, Tensor):
                continue
            storage = t.untyped_storage()
            key, nbytes = storage.data_ptr(), storage.nbytes()
            if nbytes == 0 or key in self._seen:
                continue
            self._seen.add(key)
            self.live += nbytes
            self.peak = max(self.peak, self.live)
            self.largest = max(self.largest, nbytes)
            weakref.finalize(storage, self._release, key, nbytes)
        return out


def peak_tensor_bytes(fn: Callable[[], object]) -> tuple[int, int]:
    """Run ``fn()``; return (peak live bytes, largest single tensor) of what it allocates.

    Counts every tensor storage created by an aten op while ``fn`` runs (forward and, if
    ``fn`` calls it, backward), freed when its last reference goes; tensors created
    before the call are not counted. Scratch space inside a fused kernel is not seen.
    This is how the chunked backend's memory bound is checked on CPU.
    """
    with _TensorMemory() as tracker:
        fn()
    return tracker.peak, tracker.largest
