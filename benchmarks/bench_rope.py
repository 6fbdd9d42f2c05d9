"""RoPE speed: ``posenc.apply_rope`` / ``apply_rope_`` against the copy floor, the
transformers-style expression, Meta's complex multiply and, when installed,
transformers' ``apply_rotary_pos_emb`` and ``rotary-embedding-torch``.

Shapes ``[4, 16, 2048, 64]`` and ``[1, 32, 8192, 128]`` (float32) and
``[4, 16, 2048, 64]`` (bfloat16), forward and forward+backward. Same options as
``posenc bench``; ``--load 2`` measures beside two busy processes:

    python benchmarks/bench_rope.py --threads 2 --load 2 --json rope.json
"""

from __future__ import annotations

import sys

from posenc.cli import main

if __name__ == "__main__":
    raise SystemExit(main(["bench", "--only", "rope", *sys.argv[1:]]))
