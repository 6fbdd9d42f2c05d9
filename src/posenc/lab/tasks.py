"""Synthetic tasks where position is the whole problem (Kazemnejad et al. 2023, "The
Impact of Positional Encoding on Length Generalization in Transformers", section 3).

Shapes: ``B`` batch, ``T`` length. A model reads ``T`` tokens and is scored only on the
answer tokens (targets elsewhere are ``IGNORE``); an example counts as solved when every
answer token is the argmax (exact match, which is what greedy decoding would produce).

* ``copy``: ``x_1 .. x_n | x_1 .. x_n`` with ``n = T // 2`` symbols;
* ``reverse``: ``x_1 .. x_n | x_n .. x_1``;
* ``recall`` (multi-query associative recall): ``k_1 v_1 .. k_n v_n |`` followed by
  ``min(n, 4)`` of the keys, each with its value to be recalled.

Training samples every size up to the training length (shorter examples are padded on
the right, which a causal model never sees); evaluation at length ``T`` uses the largest
size that fits ``T``, so longer lengths test positions the model never saw.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posenc._checks import check_int

__all__ = ["IGNORE", "Task"]

PAD, SEP = 0, 1
#: Target value of tokens that are not scored (``F.cross_entropy``'s ``ignore_index``).
IGNORE = -100
_SYMBOLS = 16  # content alphabet of copy/reverse, value alphabet of recall
_FIRST = 2  # first content token id
_QUERIES = 4


class Task:
    """One synthetic task for lengths up to ``max_len``.

    Args:
        name: ``"copy"``, ``"reverse"`` or ``"recall"``.
        max_len: the longest length the task will be asked for (sizes recall's key set).

    Raises:
        ValueError: unknown ``name`` or a ``max_len`` too short for one example.
    """

    def __init__(self, name: str, max_len: int) -> None:
        if name not in ("copy", "reverse", "recall"):
            raise ValueError(f"unknown task {name!r}; known tasks: copy, reverse, recall")
        self.name = name
        self.max_len = check_int("max_len", max_len, minimum=4)
        self.num_keys = self.size(max_len) if name == "recall" else 0

    @property
    def vocab_size(self) -> int:
        return _FIRST + _SYMBOLS + self.num_keys

    def size(self, length: int) -> int:
        """The largest problem size whose input fits ``length`` tokens."""
        if self.name != "recall":
            return length // 2
        return length // 2 - _QUERIES if length >= 4 * _QUERIES else length // 4

    def example(self, n: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
        """One example of size ``n``: input tokens ``[L]`` and targets ``[L]``."""
        if self.name == "recall":
            keys = _FIRST + _SYMBOLS + torch.randperm(self.num_keys, generator=gen)[:n]
            values = torch.randint(_FIRST, _FIRST + _SYMBOLS, (n,), generator=gen)
            asked = torch.randperm(n, generator=gen)[: min(n, _QUERIES)]
            pairs = torch.stack((keys, values), 1).flatten()  # [2n]
            queries = torch.stack((keys[asked], values[asked]), 1).flatten()  # [2q]
            seq = torch.cat((pairs, torch.tensor([SEP]), queries))
            scored = torch.zeros(seq.numel() - 1, dtype=torch.bool)
            scored[2 * n + 1 :: 2] = True  # the positions that read a key and predict its value
        else:
            symbols = torch.randint(_FIRST, _FIRST + _SYMBOLS, (n,), generator=gen)
            answer = symbols.flip(0) if self.name == "reverse" else symbols
            seq = torch.cat((symbols, torch.tensor([SEP]), answer))
            scored = torch.zeros(seq.numel() - 1, dtype=torch.bool)
            scored[n:] = True
        targets = torch.where(scored, seq[1:], IGNORE)
        return seq[:-1], targets

    def batch(
        self, batch_size: int, length: int, gen: torch.Generator, *, exact: bool
    ) -> tuple[Tensor, Tensor]:
        """``batch_size`` examples padded to ``length``: inputs and targets ``[B, T]``.

        ``exact`` uses the largest size for ``length``; otherwise sizes are uniform in
        ``1 .. size(length)``.

        Raises:
            ValueError: ``length`` exceeds ``max_len`` or is too short for one example.
        """
        top = self.size(length)
        if top < 1 or length > self.max_len:
            raise ValueError(
                f"task {self.name} cannot make examples of length {length} "
                f"(supported: 4 .. {self.max_len})"
            )
        inputs = torch.full((batch_size, length), PAD, dtype=torch.long)
        targets = torch.full((batch_size, length), IGNORE, dtype=torch.long)
        sizes = (
            torch.full((batch_size,), top)
            if exact
            else torch.randint(1, top + 1, (batch_size,), generator=gen)
        )
        for row, n in enumerate(sizes.tolist()):
            x, y = self.example(n, gen)
            inputs[row, : x.numel()] = x
            targets[row, : y.numel()] = y
        return inputs, targets
