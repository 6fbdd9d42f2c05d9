"""``posenc audit``: one checkpoint's positions as each runtime reads them, compared by layer.

One reader per runtime (``posenc.audit.transformers``, ``posenc.audit.gguf``, vLLM's in
its own environment) returns a ``Reading`` (``posenc.audit.reading``); ``posenc.audit.compare``
puts them side by side.
"""

from posenc.audit.reading import LayerPositions, Reading

__all__ = ["LayerPositions", "Reading"]
