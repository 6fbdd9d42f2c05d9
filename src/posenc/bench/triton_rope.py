"""GPU RoPE benchmark: ``posenc.triton.apply_rope`` against the HBM copy rate.

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head_dim; q and k ``[B, H, T, D]``.
On a CUDA device, each case rotates q and k: the copy of both into preallocated tensors
(the floor: one read and one write, the HBM copy rate), posenc's Triton kernel in both
layouts (out of place and in place), the transformers-style expression
``q * cos + rotate_half(q) * sin``, and, where they import, flash-attn's
``apply_rotary_emb`` and Liger's ``liger_rotary_pos_emb``. Times come from CUDA events
around ``CALLS`` back-to-back calls (launch overhead amortized), round-robin over the
cases, median and maximum of the repeats. Without a CUDA device or Triton the suite
measures nothing and says why.
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Callable

import torch
from torch import Tensor

from posenc.bench.timing import Group, Stats

__all__ = ["SHAPES", "time_cuda", "triton_rope_groups", "unavailable_reason"]

SHAPES = ((4, 16, 2048, 64), (1, 32, 8192, 128))
QUICK_SHAPES = ((1, 2, 64, 32),)
CALLS = 20
FLOOR = "copy of q and k (HBM copy rate)"
EXPRESSION = "transformers-style expression"


def unavailable_reason() -> str | None:
    """Why the GPU suite cannot run here, or None when it can."""
    if not torch.cuda.is_available():
        return "no CUDA device (GPU speed not measured)"
    from posenc import triton as posenc_triton

    return None if posenc_triton.available() else "Triton is not installed"


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _others(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> dict[str, Callable[[], object]]:
    """flash-attn's and Liger's RoPE, for those that import and run."""
    cases: dict[str, Callable[[], object]] = {}
    q_t, k_t = q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous()  # [B, T, H, D]
    full_cos, full_sin = torch.cat((cos, cos), -1)[None], torch.cat((sin, sin), -1)[None]
    candidates = {
        "flash-attn apply_rotary_emb": ("flash_attn.layers.rotary", lambda m: (
            m.apply_rotary_emb(q_t, cos, sin), m.apply_rotary_emb(k_t, cos, sin),
        )),
        "Liger rope": ("liger_kernel.ops.rope", lambda m: m.LigerRopeFunction.apply(
            q.clone(), k.clone(), full_cos, full_sin,
        )),
    }  # fmt: skip
    for name, (module, call) in candidates.items():
        try:
            mod = importlib.import_module(module)
            call(mod)
        except Exception:  # not installed, or an API this version does not have
            continue
        cases[name] = lambda call=call, mod=mod: call(mod)
    return cases


def _cases(shape: tuple[int, ...], dtype: torch.dtype) -> dict[str, Callable[[], object]]:
    from posenc import triton as posenc_triton

    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k = (torch.randn(shape, device="cuda", dtype=dtype, generator=gen) for _ in range(2))
    angles = torch.rand(shape[2], shape[3] // 2, device="cuda", generator=gen) * 100
    cos, sin = angles.cos(), angles.sin()
    full_cos, full_sin = torch.cat((cos, cos), -1).to(dtype), torch.cat((sin, sin), -1).to(dtype)
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    rope = posenc_triton.apply_rope
    cases: dict[str, Callable[[], object]] = {
        FLOOR: lambda: (q_out.copy_(q), k_out.copy_(k)),
        EXPRESSION: lambda: (
            q * full_cos + _rotate_half(q) * full_sin,
            k * full_cos + _rotate_half(k) * full_sin,
        ),
    }
    for interleaved, layout in ((False, "half-split"), (True, "interleaved")):
        cases[f"posenc.triton {layout}"] = lambda i=interleaved: (
            rope(q, cos, sin, interleaved=i),
            rope(k, cos, sin, interleaved=i),
        )
        cases[f"posenc.triton {layout}, in place"] = lambda i=interleaved: (
            rope(q_out, cos, sin, interleaved=i, inplace=True),
            rope(k_out, cos, sin, interleaved=i, inplace=True),
        )
    cases.update(_others(q, k, cos, sin))
    return cases


def time_cuda(
    cases: dict[str, Callable[[], object]], repeats: int, warmup: int, calls: int = CALLS
) -> dict[str, Stats]:
    """Time per call of each case, from CUDA events around ``calls`` back-to-back calls,
    in a new random order each round."""
    for _ in range(warmup):
        for fn in cases.values():
            fn()
    torch.cuda.synchronize()
    order, names = random.Random(0), list(cases)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(repeats):
        for name in order.sample(names, len(names)):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                cases[name]()
            stop.record()
            stop.synchronize()
            seconds[name].append(start.elapsed_time(stop) / 1e3 / calls)
    return {name: Stats.of(s) for name, s in seconds.items()}


def triton_rope_groups(*, quick: bool, repeats: int, warmup: int) -> list[Group]:
    """One group per shape and dtype, on the current CUDA device; [] without one."""
    if unavailable_reason() is not None:
        return []
    device = torch.cuda.get_device_name()
    groups = []
    for shape in QUICK_SHAPES if quick else SHAPES:
        for dtype in (torch.float32, torch.bfloat16):
            stats = time_cuda(_cases(shape, dtype), repeats, warmup)
            name = str(dtype).removeprefix("torch.")
            info = {"shape": list(shape), "dtype": name, "device": device}
            title = f"GPU RoPE {list(shape)} {name} on {device}, q and k"
            groups.append(
                Group("triton", title, stats, floor=FLOOR, speedup_over=(EXPRESSION,), info=info)
            )
    return groups
