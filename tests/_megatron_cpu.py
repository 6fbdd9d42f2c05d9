"""Megatron-Core's rotary code on a CPU-only machine, for the context-parallel tests.

Megatron asks its context-parallel group only for ``size()`` and ``rank()``, builds its CP
index pinned and moves it (and its frequencies) to CUDA; ``patch_to_cpu`` keeps all of it on
the CPU and changes nothing else.
"""

from __future__ import annotations

import warnings

import pytest
import torch


class Group:
    """A stand-in context-parallel process group of ``size`` ranks, seen from ``rank``."""

    def __init__(self, size: int, rank: int) -> None:
        self._size, self._rank = size, rank

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank


class _CpuTorch:
    """``torch`` as Megatron's rope_utils sees it, with ``torch.tensor`` ignoring pin_memory."""

    def __getattr__(self, name: str):
        return getattr(torch, name)

    @staticmethod
    def tensor(data, *, pin_memory: bool = False, **kwargs) -> torch.Tensor:
        return torch.tensor(data, **kwargs)


def import_embeddings():
    """Megatron-Core's ``rope_utils``, ``RotaryEmbedding`` and ``YarnRotaryEmbedding``."""
    pytest.importorskip("megatron.core")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed"
        from megatron.core.models.common.embeddings import rope_utils, rotary_pos_embedding
        from megatron.core.models.common.embeddings import yarn_rotary_pos_embedding as yarn
    return rope_utils, rotary_pos_embedding.RotaryEmbedding, yarn.YarnRotaryEmbedding


def patch_to_cpu(rope_utils, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rope_utils, "torch", _CpuTorch())
    monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *args, **kwargs: self)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
