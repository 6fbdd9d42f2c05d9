"""Additive encodings benchmark: sinusoidal and learned ``x + PE`` against the copy floor.

Shapes: ``B`` batch, ``T`` length, ``C`` d_model. Adding a ``[T, C]`` table to
``x [B, T, C]`` reads ``x`` once and writes the result once, like a copy; the floor
copies ``x`` into a preallocated tensor; ``posenc.fastpath.add`` is the one-pass addition
into a fresh output that the modules can use. The table construction (cold: a new module;
cached: the same module again) is timed in its own group.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from posenc.bench.timing import Group, measure
from posenc.encodings.learned import LearnedPositionalEncoding
from posenc.encodings.sinusoidal import SinusoidalPositionalEncoding
from posenc.fastpath import add

__all__ = ["additive_groups"]

FLOOR = "copy floor"
FULL = (((8, 2048, 512), torch.float32), ((8, 2048, 512), torch.bfloat16))
QUICK = (((2, 32, 16), torch.float32),)


def _add_cases(shape: tuple[int, int, int], dtype: torch.dtype) -> dict[str, Callable[[], object]]:
    batch, length, width = shape
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(dtype)
    sinusoidal = SinusoidalPositionalEncoding(width, max_len=length)
    learned = LearnedPositionalEncoding(width, length)
    sinusoidal.eval()
    learned.eval()
    table = sinusoidal.table(length).to(dtype)  # [T, C]
    out = torch.empty_like(x)
    return {
        FLOOR: lambda: out.copy_(x),
        "x + table (fresh output)": lambda: x + table,
        "torch.add(x, table, out=preallocated)": lambda: torch.add(x, table, out=out),
        "posenc fastpath.add(x, table)": lambda: add(x, table),
        "posenc sinusoidal embed": lambda: sinusoidal(x),
        "posenc learned embed": lambda: learned(x),
        "posenc sinusoidal embed (positions given)": lambda: sinusoidal(
            x, torch.arange(length).expand(batch, length)
        ),
    }


def _table_cases(length: int, width: int) -> dict[str, Callable[[], object]]:
    cached = SinusoidalPositionalEncoding(width, max_len=length)
    cached.table(length)
    return {
        "sinusoidal table, cold (new module)": lambda: SinusoidalPositionalEncoding(
            width, max_len=length
        ).table(length),
        "sinusoidal table, cached": lambda: cached.table(length),
    }


def additive_groups(*, quick: bool, repeats: int, warmup: int) -> list[Group]:
    """Measure the additive encodings and their table construction."""
    groups = []
    for shape, dtype in QUICK if quick else FULL:
        info = {"shape": list(shape), "dtype": str(dtype).removeprefix("torch.")}
        stats = measure(_add_cases(shape, dtype), repeats=repeats, warmup=warmup)
        title = f"x + PE {list(shape)} {info['dtype']}"
        groups.append(Group("additive", title, stats, floor=FLOOR, info=info))
    _, length, width = (QUICK if quick else FULL)[0][0]
    stats = measure(_table_cases(length, width), repeats=repeats, warmup=warmup)
    info = {"shape": [length, width], "dtype": "float32"}
    groups.append(Group("additive", f"sinusoidal table [{length}, {width}]", stats, info=info))
    return groups
