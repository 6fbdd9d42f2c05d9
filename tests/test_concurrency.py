"""Forward calls from several threads on one shared module whose cache must grow.

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head_dim, ``C`` d_model.

Caches grow by building a longer table and swapping it in (never by mutating the one
that other threads may be reading), under a lock that only guards the growth. Eight
threads released together by a barrier ask one module for eight different lengths, all
beyond its initial cache, several rounds over; every result must equal a fresh module's.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import posenc
from _build import C, D, H, apply_hooks, build_encoding, make_inputs

THREADS = 8
ROUNDS = 4
LENGTHS = [3 + 37 * i for i in range(THREADS)]  # 3 .. 262, each beyond max_len = 2


def _make(name: str) -> posenc.PositionalEncoding:
    return build_encoding(name, max_len=2)


def _outputs(enc: posenc.PositionalEncoding, length: int) -> dict[str, torch.Tensor]:
    x, q, k, pos = make_inputs(length, seed=length)
    return apply_hooks(enc, x, q, k, pos, pos)


@pytest.mark.parametrize("name", ["sinusoidal", "rope", "xpos", "alibi"])
def test_threads_growing_one_cache_get_the_fresh_module_results(name):
    want = {n: _outputs(_make(name), n) for n in LENGTHS}
    with ThreadPoolExecutor(THREADS) as pool:
        for round_ in range(ROUNDS):
            shared = _make(name)
            start = threading.Barrier(THREADS)

            def call(length: int, shared=shared, start=start) -> dict[str, torch.Tensor]:
                start.wait()
                return _outputs(shared, length)

            order = LENGTHS[round_:] + LENGTHS[:round_]  # a different arrival order per round
            for length, got in zip(order, pool.map(call, order), strict=True):
                for key, value in got.items():
                    torch.testing.assert_close(value, want[length][key], rtol=0, atol=0)


def test_threads_sharing_one_attention_layer():
    torch.manual_seed(0)
    layer = posenc.MultiHeadAttention(C, H, position=posenc.RotaryEmbedding(D, max_len=2))
    torch.manual_seed(0)
    fresh = posenc.MultiHeadAttention(C, H, position=posenc.RotaryEmbedding(D, max_len=2))
    inputs = {n: make_inputs(n, seed=n)[0] for n in LENGTHS}
    start = threading.Barrier(THREADS)

    def call(length: int) -> torch.Tensor:
        start.wait()
        with torch.no_grad():
            return layer(inputs[length])

    with ThreadPoolExecutor(THREADS) as pool:
        results = list(pool.map(call, LENGTHS))
    with torch.no_grad():
        for length, got in zip(LENGTHS, results, strict=True):
            torch.testing.assert_close(got, fresh(inputs[length]), rtol=0, atol=0)
