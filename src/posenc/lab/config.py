"""Configuration of a lab sweep: one frozen dataclass, its defaults and its checks.

The lab follows Press et al. 2022 ("Train Short, Test Long", section 4): tiny causal
language models are trained on windows of ``train_len`` tokens and evaluated on longer
ones. ``LabConfig.identity()`` is what must match for a rerun in the same output folder
to reuse finished runs; it leaves out what does not change the numbers of a run (which
encodings are swept, where outputs go, the process count and thread count).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field

from posenc._checks import check_float, check_int, check_probability
from posenc.base import available, info

__all__ = [
    "DEFAULT_ENCODINGS",
    "QUICK_ENCODINGS",
    "SCALINGS",
    "TASKS",
    "LabConfig",
    "quick_defaults",
    "resolve_encodings",
]

#: The encodings swept when ``--encodings`` is not given.
DEFAULT_ENCODINGS = ("nope", "sinusoidal", "learned", "rope", "alibi", "t5")
#: The encodings of ``--quick``.
QUICK_ENCODINGS = ("nope", "rope", "alibi")
#: Rotary context-extension scalings evaluated without training (factor = L / train_len).
SCALINGS = ("linear", "ntk", "dynamic", "yarn")
#: ``lm`` is next-byte prediction on text; the others are synthetic (see ``posenc.lab.tasks``).
TASKS = ("lm", "copy", "reverse", "recall")
_BEYOND = ("error", "interpolate")


@dataclass(frozen=True)
class LabConfig:
    """Everything that defines a lab sweep.

    Args:
        encodings: registered encoding names, one model each.
        task: ``"lm"`` (perplexity on text) or a synthetic task (exact-match accuracy).
        corpus: a UTF-8 text file or folder; ``None`` means the standard library sources.
        train_len: training window length in tokens.
        eval_lens: evaluation lengths, each ``>= train_len``.
        steps: optimizer steps per model.
        batch_size: windows per step (the global batch, split across processes).
        lr: peak AdamW learning rate (linear warmup, then cosine decay to ``lr / 10``).
        warmup: warmup steps.
        weight_decay: AdamW weight decay.
        d_model: model width.
        num_layers: transformer blocks.
        num_heads: attention heads.
        eval_tokens: tokens scored per evaluation length (text; whole windows).
        eval_examples: examples scored per evaluation length (synthetic tasks).
        finetune_steps: steps of fine-tuning at the longest evaluation length (0: none).
        learned_beyond: ``"interpolate"`` adds a learned-table row stretched beyond its length.
        scalings: rotary scalings evaluated at longer lengths without training.
        seed: seeds the model initialisation and the data order.
        quick: whether the ``--quick`` presets were used (recorded, not interpreted).
    """

    encodings: tuple[str, ...] = DEFAULT_ENCODINGS
    task: str = "lm"
    corpus: str | None = None
    train_len: int = 64
    eval_lens: tuple[int, ...] = (64, 128, 256, 512, 1024)
    steps: int = 700
    batch_size: int = 32
    lr: float = 3e-3
    warmup: int = 50
    weight_decay: float = 0.01
    d_model: int = 96
    num_layers: int = 2
    num_heads: int = 4
    eval_tokens: int = 16384
    eval_examples: int = 256
    finetune_steps: int = 0
    learned_beyond: str = "error"
    scalings: tuple[str, ...] = SCALINGS
    seed: int = 0
    quick: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"unknown task {self.task!r}; known tasks: {', '.join(TASKS)}")
        if self.learned_beyond not in _BEYOND:
            raise ValueError(
                f"learned_beyond must be one of {', '.join(_BEYOND)}, got {self.learned_beyond!r}"
            )
        for name in ("train_len", "steps", "batch_size", "d_model", "num_layers", "num_heads"):
            check_int(name, getattr(self, name))
        for name in ("eval_tokens", "eval_examples"):
            check_int(name, getattr(self, name))
        check_int("warmup", self.warmup, minimum=0)
        check_int("finetune_steps", self.finetune_steps, minimum=0)
        check_int("seed", self.seed, minimum=0)
        check_float("lr", self.lr, positive=True)
        check_probability("weight_decay", self.weight_decay)
        if self.d_model % self.num_heads:
            raise ValueError(
                f"d_model={self.d_model} is not divisible by num_heads={self.num_heads}"
            )
        if (self.d_model // self.num_heads) % 2:
            raise ValueError(
                f"head_dim = d_model / num_heads = {self.d_model // self.num_heads} must be even"
            )
        if not self.encodings:
            raise ValueError("no encodings to sweep")
        for name in self.encodings:
            info(name)  # raises ValueError listing the known names
        if len(set(self.encodings)) != len(self.encodings):
            raise ValueError(f"encodings are repeated: {', '.join(self.encodings)}")
        unknown = [s for s in self.scalings if s not in SCALINGS]
        if unknown:
            raise ValueError(f"unknown scaling {unknown[0]!r}; known: {', '.join(SCALINGS)}")
        if not self.eval_lens:
            raise ValueError("no evaluation lengths")
        for length in self.eval_lens:
            check_int("evaluation length", length)
        short = [n for n in self.eval_lens if n < self.train_len]
        if short:
            raise ValueError(
                f"evaluation length {short[0]} is shorter than the training length "
                f"{self.train_len}; evaluation lengths must be >= --train-len"
            )
        if tuple(sorted(set(self.eval_lens))) != self.eval_lens:
            raise ValueError(
                f"evaluation lengths must be increasing and distinct, got {list(self.eval_lens)}"
            )
        if self.task != "lm" and self.train_len < 4:
            raise ValueError(f"synthetic tasks need train_len >= 4, got {self.train_len}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    def to_dict(self) -> dict[str, object]:
        """Plain JSON-ready mapping of every field."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.__dict__.items()}

    def identity(self, corpus_sha256: str | None) -> dict[str, object]:
        """The fields a resumed sweep must share, with the corpus hash."""
        kept = self.to_dict()
        for key in ("encodings", "quick", "corpus"):
            kept.pop(key)
        kept["corpus_sha256"] = corpus_sha256
        return kept

    def identity_hash(self, corpus_sha256: str | None) -> str:
        text = json.dumps(self.identity(corpus_sha256), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def replace(self, **changes: object) -> LabConfig:
        return dataclasses.replace(self, **changes)


def quick_defaults(task: str) -> dict[str, object]:
    """The ``--quick`` presets: a tiny model, few steps, lengths 32..128 (under a minute)."""
    lens = (32, 64, 128) if task == "lm" else (16, 32, 64)
    return {
        "encodings": QUICK_ENCODINGS,
        "train_len": lens[0],
        "eval_lens": lens,
        "steps": 120,
        "batch_size": 16,
        "warmup": 10,
        "d_model": 32,
        "num_layers": 2,
        "num_heads": 2,
        "eval_tokens": 2048,
        "eval_examples": 64,
        "quick": True,
    }


def resolve_encodings(names: list[str]) -> tuple[str, ...]:
    """Expand ``all`` and comma-separated lists into registered names (order kept).

    Raises:
        ValueError: an unknown name (the message lists the known ones).
    """
    out: list[str] = []
    for item in names:
        for name in (part.strip() for part in item.split(",")):
            if not name:
                continue
            for resolved in available() if name == "all" else [name]:
                info(resolved)
                if resolved not in out:
                    out.append(resolved)
    if not out:
        raise ValueError("--encodings is empty")
    return tuple(out)
