"""Forward calls from several threads on one shared module whose cache must grow.

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head_dim, ``C`` d_model.

Caches grow by building a longer table and swapping it in (never by mutating the one
that other threads may be reading), under a lock that only guards the growth. Eight
threads released together by a barrier ask one module for eight different lengths, all
beyond its initial cache, several rounds over; every result must equal a fresh module's.
"""

from __future__ import annotations

import copy
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import posenc
from _build import C, D, H, apply_hooks, build_encoding, make_inputs
from conftest import tolerances

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


def _decode(layer: posenc.MultiHeadAttention, x: torch.Tensor, cache, prefill: int, end: int):
    with torch.no_grad():
        layer(x[:, :prefill], cache=cache)
        for t in range(prefill, end):
            layer(x[:, t : t + 1], cache=cache)


def test_threads_decoding_with_one_shared_dynamic_rope_keep_every_cache_consistent():
    """Six threads, each with its own KVCache, one layer with dynamic-NTK RoPE (monotone
    policy) decoding past the original length: the frequencies change under them while
    they run. Every forward uses one frequency snapshot for its cached keys and its new
    queries and keys, so each cache ends equal to the serial run's."""
    torch.manual_seed(0)
    rope = posenc.RotaryEmbedding(
        D, scaling={"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 32}
    )
    layer = posenc.MultiHeadAttention(C, H, position=rope).eval()
    spans = [(20 + 2 * i, 40 + 9 * i) for i in range(6)]  # every thread crosses 32
    xs = [make_inputs(100, seed=i)[0] for i in range(len(spans))]
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        caches = [posenc.KVCache() for _ in spans]
        start = threading.Barrier(len(spans))

        def run(i: int) -> None:
            start.wait()
            _decode(layer, xs[i], caches[i], *spans[i])

        with ThreadPoolExecutor(len(spans)) as pool:
            list(pool.map(run, range(len(spans))))
    finally:
        sys.setswitchinterval(old)
    serial = [posenc.KVCache() for _ in spans]
    for i, span in enumerate(spans):
        _decode(layer, xs[i], serial[i], *span)
    for threaded, alone, x in zip(caches, serial, xs, strict=True):
        for cache in (threaded, alone):  # one more step: sync to the final frequencies
            with torch.no_grad():
                layer(x[:, len(cache) : len(cache) + 1], cache=cache)
        # both hold keys re-rotated from other frequencies: float32 rotations, a few ulps
        torch.testing.assert_close(threaded.keys, alone.keys, **tolerances(torch.float32, ops=64))
        positions = torch.arange(len(alone))
        k = layer.k_proj(x[:, : len(alone)]).view(x.shape[0], -1, H, D).transpose(1, 2)
        cos, sin = rope.cos_sin(positions)
        fresh = posenc.apply_rope(k, cos, sin)
        torch.testing.assert_close(threaded.keys, fresh, **tolerances(torch.float32, ops=64))


class _OtherUserBetweenSteps(dict):
    """A cache record that lets "another thread" grow the shared RoPE's length right after
    the cache was synced, the window in which a forward used to read the frequencies again."""

    def __init__(self, rope: posenc.RotaryEmbedding) -> None:
        super().__init__()
        self.rope, self.calls = rope, 0

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, value)
        self.calls += 1
        self.rope.observe_length(self.rope.seen_length + 16)


def test_a_length_change_between_sync_and_rotation_cannot_split_a_forward():
    torch.manual_seed(0)
    rope = posenc.RotaryEmbedding(
        D, scaling={"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 8}
    )
    layer = posenc.MultiHeadAttention(C, H, position=rope).eval()
    x = make_inputs(12)[0]
    cache = posenc.KVCache()
    cache.rotations = _OtherUserBetweenSteps(rope)
    with torch.no_grad():
        for t in range(x.shape[1]):
            layer(x[:, t : t + 1], cache=cache)
        assert cache.rotations.calls == x.shape[1]
        cache.rotations = dict(cache.rotations)  # no more interference
        layer(x[:, :1], torch.tensor([x.shape[1]]), cache=cache)  # syncs to the final freqs
    k = layer.k_proj(x).view(x.shape[0], -1, H, D).transpose(1, 2)
    cos, sin = rope.cos_sin(torch.arange(x.shape[1]))
    fresh = posenc.apply_rope(k, cos, sin)
    torch.testing.assert_close(cache.keys[:, :, :-1], fresh, **tolerances(torch.float32, ops=64))


@torch.no_grad()
def test_a_kv_cache_used_by_two_threads_at_once_is_refused():
    """guarantees.md: a second call on a cache that another thread's call holds raises
    instead of interleaving two histories; the holder's decoding is unchanged."""
    torch.manual_seed(0)
    layer = posenc.MultiHeadAttention(C, H, position="rope").eval()
    x = torch.randn(1, 6, C)
    cache, serial = posenc.KVCache(), posenc.KVCache()
    inside, release = threading.Event(), threading.Event()

    def hold(module, args):  # the first call waits inside the layer, holding the cache
        if threading.current_thread().name == "holder":
            inside.set()
            assert release.wait(10)

    handle = layer.k_proj.register_forward_pre_hook(hold)
    outs = {}
    holder = threading.Thread(
        target=lambda: outs.setdefault("held", layer(x[:, :4], cache=cache)), name="holder"
    )
    holder.start()
    try:
        assert inside.wait(10)
        with pytest.raises(RuntimeError, match="in use by another call"):
            layer(x[:, 4:5], cache=cache)
    finally:
        release.set()
        holder.join()
        handle.remove()
    assert len(cache) == 4  # the refused call appended nothing
    last = layer(x[:, 4:], cache=cache)  # free again: decoding goes on as if alone
    torch.testing.assert_close(outs["held"], layer(x[:, :4], cache=serial), rtol=0, atol=0)
    torch.testing.assert_close(last, layer(x[:, 4:], cache=serial), rtol=0, atol=0)
    assert len(cache) == len(serial) == 6
    copied = copy.deepcopy(cache)  # the lock is not copied: the copy is idle and usable
    assert len(layer(x[:, 5:], cache=copied)) == 1 and len(copied) == 7
