"""Build the compiled CPU kernel of ``apply_rope`` (``python -m
posenc.encodings.rotary.build_kernel``; ``scripts/setup.sh`` runs it).

Exits 1 with the compiler's message when it cannot be built; ``apply_rope`` then runs
its PyTorch implementation, as ``posenc --version`` reports.
"""

from __future__ import annotations

import sys

from posenc.encodings.rotary.cpu_kernel import build


def main() -> int:
    """Build the kernel; print where it went, or why it could not be built."""
    try:
        path = build()
    except RuntimeError as err:
        print(f"posenc: CPU RoPE kernel not built, the PyTorch path will be used: {err}")
        return 1
    print(f"posenc: built the CPU RoPE kernel {path.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
