"""Lab throughput benchmark: one training step and one evaluation forward of the lab's
``TinyLM`` per encoding, in tokens per second.

Shapes: ``B`` windows, ``T`` length; the default sweep trains on ``[48, 64]`` and scores
up to ``T = 1024``. NoPE (no position work at all) is the floor: each encoding's
multiple of it is what its position code costs in a whole model step (forward, backward,
AdamW). ``Group.info["tokens_per_second"]`` gives the throughput per case. Both passes
run in float32 and, as ``<name> bf16``, in the bfloat16 mixed precision the lab uses by
default on hardware with bfloat16 arithmetic (``posenc.lab.precision``), so the two
compare in one run.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from posenc.bench.timing import Group, measure
from posenc.lab.config import DEFAULT_ENCODINGS, LabConfig
from posenc.lab.model import TinyLM
from posenc.lab.precision import autocast
from posenc.lab.train import adamw
from posenc.lab.variants import build_encoding

__all__ = ["lab_groups"]

FLOOR = "nope"
CPU = torch.device("cpu")


def _model(name: str, config: LabConfig) -> TinyLM:
    """The lab's model for ``name`` (a learned table interpolates past its rows)."""
    torch.manual_seed(0)
    options = {"beyond": "interpolate"} if name == "learned" else {}
    return TinyLM(build_encoding(name, config, **options), vocab_size=256,
                  d_model=config.d_model, num_layers=config.num_layers,
                  num_heads=config.num_heads)  # fmt: skip


def _train_step(
    name: str, config: LabConfig, batch: int, dtype: torch.dtype
) -> Callable[[], object]:
    model = _model(name, config)
    optimizer = adamw(model, lr=config.lr, weight_decay=config.weight_decay)  # the lab's
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 256, (batch, config.train_len + 1), generator=gen)

    def step() -> None:
        with autocast(dtype, CPU):
            logits = model(tokens[:, :-1])  # [B, T, V], float32
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def _eval_forward(
    name: str, config: LabConfig, batch: int, length: int, dtype: torch.dtype
) -> Callable[[], object]:
    model = _model(name, config).eval()
    tokens = torch.randint(0, 256, (batch, length), generator=torch.Generator().manual_seed(0))

    def forward() -> None:
        with torch.inference_mode(), autocast(dtype, CPU):
            model(tokens)

    return forward


def _both(case: Callable[[str, torch.dtype], Callable[[], object]]) -> dict:
    """``case`` per default encoding in float32 (``name``) and bfloat16 (``name bf16``)."""
    cases = {}
    for name in DEFAULT_ENCODINGS:
        cases[name] = case(name, torch.float32)
        cases[f"{name} bf16"] = case(name, torch.bfloat16)
    return cases


def _group(title: str, cases: dict, tokens: int, *, repeats: int, warmup: int) -> Group:
    stats = measure(cases, repeats=repeats, warmup=warmup)
    rate = {name: round(tokens / (s.median_ms / 1000)) for name, s in stats.items()}
    info = {"tokens_per_step": tokens, "tokens_per_second": rate}
    return Group("lab", title, stats, floor=FLOOR, info=info)


def lab_groups(*, quick: bool, repeats: int, warmup: int) -> list[Group]:
    """Time a training step ``[B, train_len]`` and an evaluation forward per encoding."""
    config = LabConfig(d_model=16, num_heads=2) if quick else LabConfig()
    batch, length = (4, 64) if quick else (config.batch_size, max(config.eval_lens))
    train = _both(lambda name, dtype: _train_step(name, config, batch, dtype))
    title = (
        f"lab training step [{batch}, {config.train_len}], d_model {config.d_model}, "
        "float32 and bfloat16 mixed precision"
    )
    groups = [_group(title, train, batch * config.train_len, repeats=repeats, warmup=warmup)]
    windows = 8 if quick else max(1, 16384 // length)
    forward = _both(lambda name, dtype: _eval_forward(name, config, windows, length, dtype))
    title = f"lab evaluation forward [{windows}, {length}], float32 and bfloat16"
    groups.append(_group(title, forward, windows * length, repeats=repeats, warmup=warmup))
    return groups
