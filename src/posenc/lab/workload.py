"""What the lab's models learn and how they are scored: bytes of text (per-byte
perplexity, Press et al. 2022, section 4) or a synthetic task (accuracy,
Kazemnejad et al. 2023, section 3; passkey retrieval, Mohtashami & Jaggi 2023).

Shapes: ``B`` batch, ``T`` length. A ``Workload`` hands out samplers of global batches
``(inputs [B, T], targets [B, T])`` for a length and seed, and scores a model at one
evaluation length. With ``val_every`` it also hands out the validation set of a seed
(``posenc.lab.plateau``): text windows taken out of the training text, or task examples
of their own stream.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from posenc.lab.config import LabConfig
from posenc.lab.corpus import Corpus, load_corpus
from posenc.lab.distributed import Context
from posenc.lab.evaluate import accuracy, perplexity, segment_starts
from posenc.lab.plateau import VAL_STREAM, split_validation
from posenc.lab.precision import resolve_precision
from posenc.lab.tasks import Task
from posenc.lab.train import TaskStream, TextWindows

__all__ = ["Workload", "make_workload"]

Sampler = Callable[[int], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class Workload:
    """What the models learn and how they are scored (text or a synthetic task)."""

    metric: str
    vocab_size: int
    data: dict[str, object]
    sha256: str | None
    sampler: Callable[[int, int], Sampler]  # (length, seed) -> global batches
    evaluate: Callable[[nn.Module, int, int], dict[str, object]]  # (model, length, seed)
    dtype: torch.dtype  # of the matrix products (``LabConfig.precision``)
    validation: Callable[[int], tuple[torch.Tensor, torch.Tensor]] | None = None  # seed ->


def make_workload(config: LabConfig, context: Context) -> Workload:
    """Load the corpus (or make the task) of ``config`` and check it fits the lengths.

    Raises:
        FileNotFoundError: the corpus path does not exist.
        ValueError: an empty or non-UTF-8 corpus, or held-out text too short for one
            window of the longest evaluation length.
    """
    longest = max(config.eval_lens)
    dtype = resolve_precision(config.precision, context.device)
    if config.task != "lm":
        task = Task(config.task, longest, key_len=config.passkey_key_len)
        examples = max(1, config.val_tokens // config.train_len)
        return Workload(
            metric="accuracy",
            vocab_size=task.vocab_size,
            data={"task": config.task, "vocab_size": task.vocab_size},
            sha256=None,
            sampler=lambda length, seed: TaskStream(task, length, seed),
            evaluate=lambda model, length, seed: accuracy(
                model,
                task,
                length,
                examples=config.eval_examples,
                seed=seed,
                context=context,
                dtype=dtype,
            ),
            dtype=dtype,
            validation=None
            if config.val_every is None
            else lambda seed: TaskStream(task, config.train_len, VAL_STREAM + seed)(examples),
        )
    corpus = load_corpus(config.corpus)
    _text_score = _text_scores(config, context, dtype, corpus.heldout_bounds)
    reserve = 0 if config.eval_stride is None else longest  # context before sliding windows
    bounds = corpus.heldout_bounds
    if segment_starts(bounds, longest, config.eval_tokens, pad=reserve).numel() == 0:
        raise ValueError(
            f"the held-out part of corpus {corpus.source!r} has {corpus.heldout.numel()} bytes, "
            f"too few for one window of evaluation length {longest}"
        )
    if corpus.train.numel() <= config.train_len + 1:
        raise ValueError(
            f"the training part of corpus {corpus.source!r} has {corpus.train.numel()} bytes, "
            f"too few for windows of --train-len {config.train_len}"
        )
    data = {**corpus.describe(), "segments": _segments(corpus, longest, config.eval_tokens)}
    train, validation = corpus.train, None
    if config.val_every is not None:
        train, windows = split_validation(corpus.train, config.val_tokens, config.train_len)
        pair = (windows[:, :-1], windows[:, 1:])  # [N, T] inputs and next-byte targets

        def validation(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
            return pair  # one set for every seed

        data["validation"] = {
            "source": "training text, taken out before training",
            "bytes": int(corpus.train.numel() - train.numel()),
            "tokens": int(pair[1].numel()),
            "windows": int(windows.shape[0]),
        }
    return Workload(
        metric="ppl",
        vocab_size=256,
        data=data,
        sha256=corpus.sha256,
        sampler=lambda length, seed: TextWindows(train, length, seed),
        evaluate=lambda model, length, seed: _text_score(model, corpus.heldout, length),
        dtype=dtype,
        validation=validation,
    )


def _segments(corpus: Corpus, longest: int, max_tokens: int) -> dict[str, object]:
    """Where the evaluation segments (whole windows) come from: their count, the files
    that supplied them and the most any one file supplied."""
    starts = segment_starts(corpus.heldout_bounds, longest, max_tokens).tolist()
    per_file: dict[str, int] = {}
    for name, (start, end) in zip(corpus.heldout_files, corpus.heldout_bounds, strict=True):
        count = sum(start <= s < end for s in starts)
        if count:
            per_file[name] = count
    return {
        "count": len(starts),
        "length": longest,
        "files": len(per_file),
        "cap": max(per_file.values()),
        "per_file": per_file,
    }


def _text_scores(
    config: LabConfig, context: Context, dtype: torch.dtype, bounds
) -> Callable[..., dict[str, object]]:
    """Scores at one length: perplexity (with the loss by position at the longest
    length) and, with ``eval_stride``, sliding-window perplexity under ``"sliding"``."""
    longest = max(config.eval_lens)

    def scores(model: nn.Module, data: torch.Tensor, length: int) -> dict[str, object]:
        def score(**options: object) -> dict[str, object]:
            return perplexity(
                model,
                data,
                length,
                longest=longest,
                max_tokens=config.eval_tokens,
                context=context,
                dtype=dtype,
                bounds=bounds,
                **options,
            )

        out = score(by_position=length == longest)
        if config.eval_stride is not None and config.eval_stride < length:
            out["sliding"] = {**score(stride=config.eval_stride), "stride": config.eval_stride}
        return out

    return scores
