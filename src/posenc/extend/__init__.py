"""``posenc extend``: context extension measured on a local transformers checkpoint.

Perplexity against evaluation length for the checkpoint's original positions and for
each RoPE scaling applied by ``posenc.hf.patch`` (no training), plus passkey retrieval,
with the lab's output conventions (``posenc.lab.results``).
"""

from posenc.extend.config import SCALINGS, ExtendConfig
from posenc.extend.runner import run_extend
from posenc.extend.tokenizer import byte_tokenizer

__all__ = ["SCALINGS", "ExtendConfig", "byte_tokenizer", "run_extend"]
