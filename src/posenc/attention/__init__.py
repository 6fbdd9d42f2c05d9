"""One attention module for every positional encoding, and the parts it is made of.

Layers, one way (each imports only those below it):

* ``module``: ``MultiHeadAttention`` (projections, grouped-query heads, KV cache, the
  encoding's hooks);
* ``backends``: ``attend``, which picks SDPA, eager or query-block-chunked attention from
  the encoding's sites;
* ``blocks``: the per-block computations (general, offset-table, weights-site) and
  ``grad``: their memory-bounded backward; ``memory``: peak-memory accounting;
* ``masking``: ``Masking``, which keys each query may attend to.
"""

from posenc.attention.backends import BACKENDS, DEFAULT_BLOCK_SIZE, attend, check_backend
from posenc.attention.masking import Masking
from posenc.attention.module import MultiHeadAttention, repeat_kv

__all__ = [
    "BACKENDS",
    "DEFAULT_BLOCK_SIZE",
    "Masking",
    "MultiHeadAttention",
    "attend",
    "check_backend",
    "repeat_kv",
]
