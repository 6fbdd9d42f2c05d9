"""A byte-level tokenizer that needs no download: token id ``b`` is byte ``b``.

Shapes: ``T`` tokens. Built with the ``tokenizers`` package (a byte-level BPE with the 256
byte symbols and no merges) and wrapped as a transformers ``PreTrainedTokenizerFast``, so
``save_pretrained`` writes it beside a model and ``AutoTokenizer.from_pretrained`` loads
it offline. It is the tokenizer of posenc's lab models (bytes, vocabulary 256) and of the
tiny checkpoints the tests build.
"""

from __future__ import annotations

__all__ = ["byte_tokenizer"]


def _byte_symbols() -> list[str]:
    """GPT-2's printable stand-in for each byte, in byte order (Radford et al. 2019)."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    symbols, extra = {}, 0
    for b in range(256):
        if b in printable:
            symbols[b] = chr(b)
        else:
            symbols[b] = chr(256 + extra)
            extra += 1
    return [symbols[b] for b in range(256)]


def byte_tokenizer():
    """A ``PreTrainedTokenizerFast`` mapping each UTF-8 byte to its value (``[T]`` ids <
    256) and back.

    Raises:
        ImportError: transformers or tokenizers is not installed.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {symbol: b for b, symbol in enumerate(_byte_symbols())}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=core, clean_up_tokenization_spaces=False)
