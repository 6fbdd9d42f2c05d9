"""Configuration of a lab sweep: one frozen dataclass, its defaults and its checks.

The lab follows Press et al. 2022 ("Train Short, Test Long", section 4): tiny causal
language models are trained on windows of ``train_len`` tokens and evaluated on longer
ones, once per seed. ``LabConfig.identity()`` is what must match for a rerun in the same
output folder to reuse finished runs; it leaves out what does not change the numbers of
one run (which encodings and seeds are swept, where outputs go, process and thread
counts).

The baselines are configured as their papers and Hugging Face transformers define them:

* rotary scalings evaluated without training use ``factor = L / train_len`` at length
  ``L`` (linear PI, NTK-aware, YaRN), the usual protocol for static scalings; dynamic NTK
  (emozilla 2023) computes its own stretch from the length, and its ``factor`` is a
  separate hyperparameter, ``dynamic_factor`` (transformers:
  ``base * (factor * L / L0 - (factor - 1)) ** (d / (d - 2))`` once ``L > L0``);
* position interpolation follows Chen et al. 2023: a short fine-tune (``finetune_steps``)
  at ``finetune_len`` with the fixed factor ``finetune_len / train_len``, compared with
  the same model fine-tuned the same way without the scaling;
* T5's ``max_distance`` defaults to ``train_len`` (at least 32), so every bucket
  receives a gradient;
* learned tables start as GPT-2's, N(0, 0.02^2), from the encoding's own random stream
  (``posenc.lab.model.seeded_model``), and the interpolating learned row is part of the
  default sweep;
* YaRN's betas and NTK-aware's alpha follow the training length, with transformers'
  defaults as rows, and dynamic NTK is also scored as decoded (``posenc.lab.variants``).

Text trains for exactly ``steps`` unless ``plateau`` is set: then it goes on past
``steps`` at the schedule's floor rate until the validation loss (``val_every``,
``val_tokens``; ``posenc.lab.plateau``) plateaus, or ``max_steps``. ``--profile
thorough`` (``thorough_defaults``) sets those; the default profile is the fixed budget.

The arithmetic is ``precision``: ``"auto"`` (the default) is bfloat16 mixed precision
where the hardware has bfloat16 arithmetic and float32 elsewhere (``posenc.lab.precision``
says what runs in which dtype).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field

from posenc._checks import check_float, check_int, check_probability
from posenc.base import available, info
from posenc.lab.precision import check_precision
from posenc.lab.tasks import TASK_NAMES

__all__ = [
    "DEFAULT_ENCODINGS",
    "DEFAULT_SEEDS",
    "LEARNED",
    "LIMITS",
    "PASSKEY_KEY_LEN",
    "PROFILES",
    "QUICK_ENCODINGS",
    "SCALINGS",
    "TASKS",
    "LabConfig",
    "quick_defaults",
    "resolve_encodings",
    "thorough_defaults",
]

#: The encodings swept when ``--encodings`` is not given.
DEFAULT_ENCODINGS = ("nope", "sinusoidal", "learned", "rope", "alibi", "t5")
#: The encodings of ``--quick``.
QUICK_ENCODINGS = ("nope", "rope", "alibi")
#: Seeds of the default sweep: six, the fewest whose assumption-free sign-flip check
#: over seeds can give p < 0.05 (2 / 2**6), with five degrees of freedom or more for the
#: mixed model the claims state (``posenc.lab.seedlevel``); 14.5 minutes on 2 quiet cores.
DEFAULT_SEEDS = (0, 1, 2, 3, 4, 5)
#: Upper bounds of the lab's sizes. It trains tiny models on a CPU in minutes; a value
#: past these (a typo, a hostile sweep file) would exhaust memory or run for days.
#: ``seed``: seeds feed ``torch.Generator.manual_seed`` after ``seed * 1_000_003 +
#: length`` (``posenc.lab.evaluate``), which must stay below 2**64.
LIMITS = {
    "number of seeds": 1000, "seed": 2**32 - 1, "block parameters": 1 << 30,
    "num_layers": 64, "num_heads": 256, "d_model": 8192,
    "batch_size": 1 << 16, "train_len": 1 << 20, "evaluation length": 1 << 20,
    "finetune_len": 1 << 20, "steps": 10**7, "max_steps": 10**7, "finetune_steps": 10**7,
    "eval_tokens": 10**9, "eval_examples": 10**6, "val_tokens": 10**8,
}  # fmt: skip


def check_limit(name: str, value: int) -> int:
    """Return ``value`` after checking it is at most ``LIMITS[name]``.

    Raises:
        ValueError: ``value`` exceeds the bound (both named).
    """
    if value > LIMITS[name]:
        raise ValueError(f"{name} must be <= {LIMITS[name]} (the lab's bound), got {value}")
    return value


#: Rotary context-extension scalings evaluated without training (see the module docstring).
SCALINGS = ("linear", "ntk", "dynamic", "yarn")
#: ``lm`` is next-byte prediction on text; the others are synthetic (see ``posenc.lab.tasks``).
TASKS = ("lm", *TASK_NAMES)
_BEYOND = ("error", "interpolate")
#: In-distribution exact match a synthetic task needs to count as learned.
LEARNED = 0.9
#: The passkey's digits in a sweep (``--passkey-key-len``): every default encoding learns
#: a 2-digit key at the training length by the first check (300 steps, one seed each; a
#: 5-digit key, ``posenc.lab.tasks.KEY_LEN``, left sinusoidal and learned tables below 25 %
#: at 1200 steps), so the length columns compare encodings (docs/lab.md).
PASSKEY_KEY_LEN = 2
#: ``--profile`` values: the fixed budget, or longer training with plateau stopping.
PROFILES = ("default", "thorough")


@dataclass(frozen=True)
class LabConfig:
    """Everything that defines a lab sweep.

    Args:
        encodings: registered encoding names, one model each.
        task: ``"lm"`` (perplexity on text) or a synthetic task (exact-match accuracy).
        corpus: a UTF-8 text file or folder; ``None`` means the standard library sources.
        train_len: training window length in tokens.
        eval_lens: evaluation lengths, each ``>= train_len``.
        steps: optimizer steps per model (synthetic tasks, and text with ``plateau``:
            at least this many).
        max_steps: the cap on training past ``steps``, until a task is learned or the
            validation loss plateaus (``None``: ``4 * steps``; see ``step_cap``).
        batch_size: windows per step (the global batch, split across processes).
        lr: peak AdamW learning rate (linear warmup, then cosine decay to ``lr / 10``).
        warmup: warmup steps.
        weight_decay: AdamW weight decay.
        d_model: model width.
        num_layers: transformer blocks.
        num_heads: attention heads.
        eval_tokens: tokens scored per evaluation length (text; whole windows).
        eval_examples: examples scored per evaluation length (synthetic tasks).
        eval_stride: sliding-window evaluation as well: each window of ``L`` scores only
            its last ``eval_stride`` tokens (``None``: non-overlapping windows only).
        precision: ``"auto"``, ``"float32"`` or ``"bfloat16"`` (mixed precision; see
            ``posenc.lab.precision``).
        finetune_steps: steps of the rotary fine-tune at ``finetune_len`` (0: none).
        finetune_len: length of that fine-tune (``None``: ``4 * train_len``).
        finetune_scalings: scalings fine-tuned at the fixed factor ``finetune_len /
            train_len`` (beside the unscaled encoding).
        learned_beyond: ``"interpolate"`` adds a learned-table row stretched beyond its length.
        scalings: rotary scalings evaluated at longer lengths without training.
        dynamic_factor: dynamic NTK's own ``factor`` hyperparameter.
        t5_max_distance: T5's ``max_distance`` (``None``: ``train_len``).
        val_every: validation loss every this many steps (``None``: none).
        val_tokens: tokens of the validation set (``posenc.lab.plateau``).
        plateau: text only: stop past ``steps`` once the last ``plateau`` validation
            losses improve on the best before them by no more than ``plateau_eps``
            (relative); ``None``: train exactly ``steps``.
        plateau_eps: that relative improvement.
        passkey_key_len: digits of the passkey (``posenc.lab.tasks``).
        seeds: one run per encoding and seed (initialisation and data order).
        quick: whether the ``--quick`` smoke-test presets were used (recorded and labelled).
        profile: the ``--profile`` whose presets were used (recorded).
    """

    encodings: tuple[str, ...] = DEFAULT_ENCODINGS
    task: str = "lm"
    corpus: str | None = None
    train_len: int = 64
    eval_lens: tuple[int, ...] = (64, 128, 256, 512, 1024)
    steps: int = 300
    max_steps: int | None = None
    batch_size: int = 48
    lr: float = 3e-3
    warmup: int = 30
    weight_decay: float = 0.01
    d_model: int = 96
    num_layers: int = 2
    num_heads: int = 4
    eval_tokens: int = 163840
    eval_examples: int = 256
    eval_stride: int | None = None
    precision: str = "auto"
    finetune_steps: int = 100
    finetune_len: int | None = None
    finetune_scalings: tuple[str, ...] = ("linear",)
    learned_beyond: str = "interpolate"
    scalings: tuple[str, ...] = SCALINGS
    dynamic_factor: float = 2.0
    t5_max_distance: int | None = None
    val_every: int | None = None
    val_tokens: int = 16384
    plateau: int | None = None
    plateau_eps: float = 0.005
    passkey_key_len: int = PASSKEY_KEY_LEN
    seeds: tuple[int, ...] = DEFAULT_SEEDS
    quick: bool = field(default=False, compare=False)
    profile: str = field(default="default", compare=False)

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"unknown task {self.task!r}; known tasks: {', '.join(TASKS)}")
        check_precision(self.precision)
        if self.learned_beyond not in _BEYOND:
            raise ValueError(
                f"learned_beyond must be one of {', '.join(_BEYOND)}, got {self.learned_beyond!r}"
            )
        for name in ("train_len", "steps", "batch_size", "d_model", "num_layers", "num_heads"):
            check_limit(name, check_int(name, getattr(self, name)))
        for name in ("eval_tokens", "eval_examples"):
            check_limit(name, check_int(name, getattr(self, name)))
        check_int("warmup", self.warmup, minimum=0)
        self._check_validation()
        if self.max_steps is not None:
            if self.task == "lm" and self.plateau is None:
                raise ValueError(
                    "max_steps applies to synthetic tasks and to text with --plateau (text "
                    f"trains for --steps otherwise); got max_steps={self.max_steps} with task 'lm'"
                )
            check_limit("max_steps", check_int("max_steps", self.max_steps, minimum=self.steps))
        check_limit("finetune_steps", check_int("finetune_steps", self.finetune_steps, minimum=0))
        if not self.seeds:
            raise ValueError("no seeds to run")
        check_limit("number of seeds", len(self.seeds))
        for seed in self.seeds:
            check_limit("seed", check_int("seed", seed, minimum=0))
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds are repeated: {list(self.seeds)}")
        check_float("lr", self.lr, positive=True)
        check_float("dynamic_factor", self.dynamic_factor, positive=True)
        if self.dynamic_factor < 1:
            raise ValueError(f"dynamic_factor must be >= 1, got {self.dynamic_factor}")
        if self.t5_max_distance is not None:
            check_int("t5_max_distance", self.t5_max_distance, minimum=2)
        check_probability("weight_decay", self.weight_decay)
        # attention 4 d^2 + MLP 8 d^2 per block (posenc.lab.model)
        check_limit("block parameters", 12 * self.num_layers * self.d_model**2)
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
        unknown = [s for s in (*self.scalings, *self.finetune_scalings) if s not in SCALINGS]
        if unknown:
            raise ValueError(f"unknown scaling {unknown[0]!r}; known: {', '.join(SCALINGS)}")
        if self.finetune_len is not None:
            check_limit("finetune_len", check_int("finetune_len", self.finetune_len))
            if self.finetune_len <= self.train_len:
                raise ValueError(
                    f"finetune_len {self.finetune_len} must exceed train_len {self.train_len}"
                )
        if not self.eval_lens:
            raise ValueError("no evaluation lengths")
        for length in self.eval_lens:
            check_limit("evaluation length", check_int("evaluation length", length))
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
        if self.eval_stride is not None:
            check_int("eval_stride", self.eval_stride)
            uneven = [n for n in self.eval_lens if n % self.eval_stride]
            if uneven:
                raise ValueError(
                    f"eval_stride {self.eval_stride} must divide every evaluation length; "
                    f"it does not divide {uneven[0]}"
                )

    def _check_validation(self) -> None:
        if self.profile not in PROFILES:
            raise ValueError(f"profile must be one of {', '.join(PROFILES)}, got {self.profile!r}")
        check_limit("val_tokens", check_int("val_tokens", self.val_tokens))
        check_int("passkey_key_len", self.passkey_key_len)
        check_probability("plateau_eps", self.plateau_eps)
        if self.val_every is not None:
            check_int("val_every", self.val_every)
        if self.plateau is None:
            return
        check_int("plateau", self.plateau)
        if self.task != "lm":
            raise ValueError(
                f"plateau applies to text only (a task trains until learned), got task "
                f"{self.task!r}"
            )
        if self.val_every is None or self.steps % self.val_every:
            raise ValueError(
                f"plateau needs val_every dividing steps (the checks follow the validations); "
                f"got val_every={self.val_every}, steps={self.steps}"
            )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    @property
    def tuned_len(self) -> int:
        """The fine-tuning length (``finetune_len`` or ``4 * train_len``)."""
        return self.finetune_len or 4 * self.train_len

    @property
    def step_cap(self) -> int | None:
        """Synthetic tasks and text with ``plateau``: the most steps a model trains for
        (``max_steps`` or ``4 * steps``); text otherwise: ``None``, exactly ``steps``."""
        if self.task == "lm" and self.plateau is None:
            return None
        return self.max_steps or 4 * self.steps

    @property
    def t5_distance(self) -> int:
        """T5's ``max_distance``: ``t5_max_distance``, else ``train_len`` (at least 32, as
        32 buckets keep 16 exact ones below it)."""
        return self.t5_max_distance or max(self.train_len, 32)

    def to_dict(self) -> dict[str, object]:
        """Plain JSON-ready mapping of every field."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.__dict__.items()}

    def identity(self, corpus_sha256: str | None) -> dict[str, object]:
        """The fields a resumed sweep must share, with the corpus hash."""
        kept = self.to_dict()
        for key in ("encodings", "seeds", "quick", "corpus", "profile"):
            kept.pop(key)
        kept["corpus_sha256"] = corpus_sha256
        kept.pop("max_steps")
        if self.step_cap is not None:
            kept["max_steps"] = self.step_cap  # the default and its value are one sweep
        if self.task != "passkey":
            kept.pop("passkey_key_len")
        if self.val_every is None and self.plateau is None:  # as before validation existed
            for key in ("val_every", "val_tokens", "plateau", "plateau_eps"):
                kept.pop(key)
        return kept

    def identity_hash(self, corpus_sha256: str | None) -> str:
        text = json.dumps(self.identity(corpus_sha256), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def replace(self, **changes: object) -> LabConfig:
        return dataclasses.replace(self, **changes)


def quick_defaults(task: str) -> dict[str, object]:
    """The ``--quick`` presets, a smoke test: a tiny model, few steps, one seed, lengths
    32..128 (under a minute). Its numbers carry no signal; output and report say so."""
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
        "finetune_steps": 0,
        "seeds": (0,),
        "quick": True,
    }


def thorough_defaults(task: str) -> dict[str, object]:
    """The ``--profile thorough`` presets: text trains at least 600 steps (the cosine
    schedule), then on at the floor rate until the validation loss (16384 bytes, every 50
    steps) has not improved by more than 0.5 % over 4 validations, at most 2400 steps;
    tasks keep their stopping rule with a cap of 4800 steps and a validation curve."""
    if task != "lm":
        return {"max_steps": 4800, "val_every": 75, "profile": "thorough"}
    return {
        "steps": 600,
        "max_steps": 2400,
        "val_every": 50,
        "plateau": 4,
        "plateau_eps": 0.005,
        "profile": "thorough",
    }


def resolve_encodings(names: list[str]) -> tuple[str, ...]:
    """Expand ``all`` and comma-separated lists into registered names (order kept).

    ``all`` is every encoding of token sequences: those taking image patch coordinates
    (``position_shape`` ``"[N, A]"``, axial RoPE) have no positions in a text task.

    Raises:
        ValueError: an unknown name (the message lists the known ones), or a patch encoding.
    """
    out: list[str] = []
    for item in names:
        for name in (part.strip() for part in item.split(",")):
            if not name:
                continue
            text = [n for n in available() if info(n).position_shape != "[N, A]"]
            for resolved in text if name == "all" else [name]:
                if info(resolved).position_shape == "[N, A]":
                    raise ValueError(
                        f"encoding {resolved!r} takes image patch coordinates, not the "
                        "lab's token sequences"
                    )
                if resolved not in out:
                    out.append(resolved)
    if not out:
        raise ValueError("--encodings is empty")
    return tuple(out)
