"""The two measurements of ``posenc extend`` at one length, memory bounded by chunking.

Shapes: ``T`` window length, ``C`` chunk, ``V`` vocabulary. A window is read ``C`` tokens
at a time through a transformers ``DynamicCache`` (the way ``generate`` reads a prompt),
so no forward holds more than ``C`` queries. Under a patched model the monotone length
policy applies as in decoding: dynamic NTK follows the length read so far and the cached
keys are re-rotated when its frequencies change.

* ``window_nll``: the negative log-likelihood of every token of a held-out window given
  the tokens before it (perplexity = ``exp(mean)``), Press et al. 2022 sec. 4;
* ``passkey``: Mohtashami & Jaggi 2023 ("Landmark Attention", sec. 4.2): a 5-digit key
  hidden at a depth of repeated filler text, then a question; the trial succeeds when
  greedy decoding writes the key.
"""

from __future__ import annotations

import functools
import inspect
import random

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["passkey", "passkey_prompt", "window_nll"]

_INTRO = (
    "There is an important pass key hidden inside a lot of irrelevant text. "
    "Find it and memorize it. I will quiz you about the pass key.\n"
)
_FILLER = (
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
)
_NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key. "
_QUESTION = "\nWhat is the pass key? The pass key is"


@functools.cache
def _cache_name(model_class: type) -> str:
    """The name ``model_class.forward`` takes the KV cache by: ``cache`` (transformers >=
    5.24, where ``past_key_values`` warns that it goes away) or ``past_key_values``."""
    parameters = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def _step(model: nn.Module, ids: Tensor, cache: object, **options: object) -> object:
    """``model(ids)`` reading and filling ``cache``."""
    return model(ids, use_cache=True, **{_cache_name(type(model)): cache}, **options)


def _ids(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False).input_ids)


def _prefill(model: nn.Module, ids: Tensor, chunk: int) -> tuple[object, Tensor]:
    """Read ``ids [1, T]`` chunk by chunk; returns the cache and the last logits ``[V]``."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    for start in range(0, ids.shape[1], chunk):
        piece = ids[:, start : start + chunk]
        out = _step(model, piece, cache, logits_to_keep=1)
    return cache, out.logits[0, -1].float()


@torch.inference_mode()
def window_nll(model: nn.Module, ids: Tensor, *, chunk: int) -> Tensor:
    """Per-token negative log-likelihood ``[T - 1]`` (float64) of window ``ids [T]``."""
    from transformers import DynamicCache

    device = next(model.parameters()).device
    ids = ids.to(device)[None]  # [1, T]
    nll = []
    cache = DynamicCache(config=model.config)
    for start in range(0, ids.shape[1] - 1, chunk):
        piece = ids[:, start : start + chunk]
        logits = _step(model, piece, cache).logits[0].float()
        targets = ids[0, start + 1 : start + 1 + piece.shape[1]]  # the next tokens
        nll.append(F.cross_entropy(logits[: targets.numel()], targets, reduction="none"))
    return torch.cat(nll).double().cpu()


def passkey_prompt(tokenizer, length: int, depth: float, key: str) -> list[int]:
    """Token ids of a passkey prompt of exactly ``length`` tokens, the key at ``depth``
    (0: right after the introduction, 1: right before the question).

    Raises:
        ValueError: ``length`` too short for the introduction, key and question.
    """
    head = ([tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []) + _ids(
        tokenizer, _INTRO
    )
    needle, question = _ids(tokenizer, _NEEDLE.format(key=key)), _ids(tokenizer, _QUESTION)
    room = length - len(head) - len(needle) - len(question)
    if room < 0:
        raise ValueError(
            f"a passkey prompt needs at least {length - room} tokens with this tokenizer, "
            f"got length {length}"
        )
    unit = _ids(tokenizer, _FILLER)
    filler = (unit * (room // max(len(unit), 1) + 1))[:room]
    cut = round(depth * room)
    return head + filler[:cut] + needle + filler[cut:] + question


@torch.inference_mode()
def passkey(
    model: nn.Module, tokenizer, length: int, depth: float, *, seed: int, chunk: int
) -> dict[str, object]:
    """One trial: ``{"depth", "key", "answer", "ok"}`` (greedy decoding after the prompt)."""
    key = f"{random.Random(f'{seed}-{length}-{depth}').randrange(10_000, 100_000)}"
    ids = torch.tensor(passkey_prompt(tokenizer, length, depth, key))[None]
    ids = ids.to(next(model.parameters()).device)
    cache, logits = _prefill(model, ids, chunk)
    steps = len(_ids(tokenizer, f" {key}.")) + 1
    answer = [int(logits.argmax())]
    for _ in range(steps - 1):
        step = torch.tensor([[answer[-1]]], device=ids.device)
        out = _step(model, step, cache)
        answer.append(int(out.logits[0, -1].argmax()))
    text = tokenizer.decode(answer, skip_special_tokens=True)
    digits = "".join(c for c in text if c.isdigit())
    return {"depth": depth, "key": key, "answer": text, "ok": digits.startswith(key)}
