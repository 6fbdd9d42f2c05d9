"""Build the compiled CPU kernel of ``apply_rope`` now instead of on first use (``python
-m posenc.encodings.rotary.build_kernel``; ``scripts/setup.sh`` runs it).

The library goes to the user's cache directory (see ``cpu_kernel``). Exits 1 with the
reason when it cannot be built; ``apply_rope`` then runs its PyTorch implementation, as
``posenc --version`` reports.
"""

from __future__ import annotations

import sys

from posenc.encodings.rotary.cpu_kernel import build


def main() -> int:
    """Build the kernel; print where it went, or why it could not be built."""
    try:
        path = build()
    except Exception as err:  # the reason, in one line: the PyTorch path still works
        reason = " ".join(str(err).split()) or type(err).__name__
        print(f"posenc: CPU RoPE kernel not built, the PyTorch path will be used: {reason}")
        return 1
    print(f"posenc: CPU RoPE kernel ready: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
