"""Synthetic tasks where position is the whole problem (Kazemnejad et al. 2023, "The
Impact of Positional Encoding on Length Generalization in Transformers", section 3).

Shapes: ``B`` batch, ``T`` length. A model reads ``T`` tokens and is scored only on the
answer tokens (targets elsewhere are ``IGNORE``); an example counts as solved when every
answer token is the argmax (exact match, which is what greedy decoding would produce).

* ``copy``: ``x_1 .. x_n | x_1 .. x_n`` with ``n = T // 2`` symbols;
* ``reverse``: ``x_1 .. x_n | x_n .. x_1``;
* ``recall`` (multi-query associative recall): ``k_1 v_1 .. k_n v_n |`` followed by
  ``min(n, 4)`` of the keys, each with its value to be recalled;
* ``addition`` (Zhou et al. 2024, "Transformers Can Achieve Length Generalization But
  Not Robustly", section 2, and Kazemnejad et al. 2023, appendix: the reversed format):
  two ``n``-digit numbers and their ``n + 1``-digit sum, every number written least
  significant digit first, ``a_1 .. a_n + b_1 .. b_n = c_1 .. c_{n+1}`` (so each answer
  digit needs only the digits at its own position and the carry), scored on the sum;
* ``sort`` (Ruoss et al. 2023, "Randomized Positional Encodings Boost Length
  Generalization of Transformers", section 4 and its table of tasks, after Deletang et
  al. 2023): ``x_1 .. x_n | sorted(x)``, ``n`` symbols of an alphabet of 16 in
  ascending order;
* ``passkey`` (Mohtashami & Jaggi 2023, "Landmark Attention", section 4.2): a key of
  ``key_len`` digits ``K d_1 .. d_n`` (default ``KEY_LEN``) hidden at a depth inside
  periodic filler, then ``Q`` and the key to be retrieved. Evaluation places the key at
  ``DEPTHS`` of the window in turn.

Training samples every size up to the training length (shorter examples are padded on
the right, which a causal model never sees); evaluation at length ``T`` uses the largest
size that fits ``T``, so longer lengths test positions the model never saw.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posenc._checks import check_int

__all__ = ["DEPTHS", "IGNORE", "KEY_LEN", "TASK_NAMES", "Task"]

PAD, SEP = 0, 1
#: Target value of tokens that are not scored (``F.cross_entropy``'s ``ignore_index``).
IGNORE = -100
_SYMBOLS = 16  # content alphabet of copy/reverse, value alphabet of recall
_FIRST = 2  # first content token id
_QUERIES = 4
#: The synthetic tasks.
TASK_NAMES = ("copy", "reverse", "recall", "passkey", "addition", "sort")
#: Passkey: digits, filler period, and the depths (fractions of the filler before the key)
#: evaluated in turn.
_DIGITS, _FILLER = 10, 6
_PLUS = _FIRST + _DIGITS  # addition's "+" (its "=" is SEP)
#: Digits of the passkey by default.
KEY_LEN = 5
DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)


class Task:
    """One synthetic task for lengths up to ``max_len``.

    Args:
        name: one of ``TASK_NAMES``.
        max_len: the longest length the task will be asked for (sizes recall's key set).
        key_len: passkey only: the digits of the key.

    Raises:
        ValueError: unknown ``name``, a ``max_len`` too short for one example, or a
            ``key_len`` below 1.
    """

    def __init__(self, name: str, max_len: int, *, key_len: int = KEY_LEN) -> None:
        if name not in TASK_NAMES:
            raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(TASK_NAMES)}")
        self.name = name
        self.max_len = check_int("max_len", max_len, minimum=4)
        self.key_len = check_int("key_len", key_len)
        self.num_keys = self.size(max_len) if name == "recall" else 0

    @property
    def vocab_size(self) -> int:
        if self.name == "passkey":
            return _FIRST + _DIGITS + _FILLER + 2  # digits, filler, K, Q
        if self.name == "addition":
            return _PLUS + 1  # digits and "+"
        return _FIRST + _SYMBOLS + self.num_keys

    def size(self, length: int) -> int:
        """The largest problem size whose input fits ``length`` tokens (passkey: filler)."""
        if self.name == "passkey":
            return length + 1 - 2 * (self.key_len + 1)
        if self.name == "addition":  # n + 1 + n + 1 + (n + 1) tokens, less the last
            return (length - 2) // 3
        if self.name != "recall":
            return length // 2
        return length // 2 - _QUERIES if length >= 4 * _QUERIES else length // 4

    def example(
        self, n: int, gen: torch.Generator, depth: float | None = None
    ) -> tuple[Tensor, Tensor]:
        """One example of size ``n``: input tokens ``[L]`` and targets ``[L]`` (passkey:
        the key after ``depth * n`` filler tokens; ``None``: a random depth)."""
        if self.name == "passkey":
            return self._passkey(n, gen, depth)
        if self.name == "addition":
            return _addition(n, gen)
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
            answer = {"reverse": symbols.flip(0), "sort": symbols.sort().values}.get(
                self.name, symbols
            )
            seq = torch.cat((symbols, torch.tensor([SEP]), answer))
            scored = torch.zeros(seq.numel() - 1, dtype=torch.bool)
            scored[n:] = True
        targets = torch.where(scored, seq[1:], IGNORE)
        return seq[:-1], targets

    def _passkey(self, n: int, gen: torch.Generator, depth: float | None) -> tuple[Tensor, Tensor]:
        key_mark, query_mark = _FIRST + _DIGITS + _FILLER, _FIRST + _DIGITS + _FILLER + 1
        digits = torch.randint(_FIRST, _FIRST + _DIGITS, (self.key_len,), generator=gen)
        filler = _FIRST + _DIGITS + torch.arange(n) % _FILLER
        if depth is None:
            before = int(torch.randint(0, n + 1, (1,), generator=gen))
        else:
            before = round(depth * n)
        key = torch.cat((torch.tensor([key_mark]), digits))
        query = torch.cat((torch.tensor([query_mark]), digits))
        seq = torch.cat((filler[:before], key, filler[before:], query))
        scored = torch.zeros(seq.numel() - 1, dtype=torch.bool)
        scored[-self.key_len :] = True  # Q d_1 .. d_{n-1} predict d_1 .. d_n
        return seq[:-1], torch.where(scored, seq[1:], IGNORE)

    def batch(
        self, batch_size: int, length: int, gen: torch.Generator, *, exact: bool
    ) -> tuple[Tensor, Tensor]:
        """``batch_size`` examples padded to ``length``: inputs and targets ``[B, T]``.

        ``exact`` uses the largest size for ``length`` (passkey: row ``i`` puts its key at
        ``DEPTHS[i % len(DEPTHS)]``); otherwise sizes (and depths) are uniform.

        Raises:
            ValueError: ``length`` exceeds ``max_len`` or is too short for one example.
        """
        top = self.size(length)
        if top < 1 or length > self.max_len:
            raise ValueError(
                f"task {self.name} cannot make examples of length {length} "
                f"(supported: up to {self.max_len}, and room for one example)"
            )
        inputs = torch.full((batch_size, length), PAD, dtype=torch.long)
        targets = torch.full((batch_size, length), IGNORE, dtype=torch.long)
        sizes = (
            torch.full((batch_size,), top)
            if exact
            else torch.randint(1, top + 1, (batch_size,), generator=gen)
        )
        for row, n in enumerate(sizes.tolist()):
            depth = DEPTHS[row % len(DEPTHS)] if exact and self.name == "passkey" else None
            x, y = self.example(n, gen, depth)
            inputs[row, : x.numel()] = x
            targets[row, : y.numel()] = y
        return inputs, targets


def _addition(n: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """``a + b = c``, digits least significant first: inputs and targets ``[3n + 2]``,
    the targets only on the ``n + 1`` digits of ``c``."""
    a, b = torch.randint(0, _DIGITS, (2, n), generator=gen)  # [n] each, units first
    c = torch.zeros(n + 1, dtype=torch.long)
    carry = 0
    for i, (x, y) in enumerate(zip(a.tolist(), b.tolist(), strict=True)):
        carry, c[i] = divmod(x + y + carry, _DIGITS)
    c[n] = carry
    seq = torch.cat(
        (_FIRST + a, torch.tensor([_PLUS]), _FIRST + b, torch.tensor([SEP]), _FIRST + c)
    )
    scored = torch.zeros(seq.numel() - 1, dtype=torch.bool)
    scored[2 * n + 1 :] = True  # "=" and c_1 .. c_n predict c_1 .. c_{n+1}
    return seq[:-1], torch.where(scored, seq[1:], IGNORE)
