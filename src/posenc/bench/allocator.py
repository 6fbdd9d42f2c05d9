"""The C allocator of the benchmark process: glibc's defaults, or freed memory kept.

glibc's ``malloc`` hands large freed blocks back to the kernel (``munmap`` for blocks
over its mmap threshold, a trim of the heap's top past its trim threshold), so a call
that allocates and frees a few MiB of temporaries each time pays page faults on every
call. On a virtual machine a fault costs far more than on bare metal: on the 2-core VM
of the recorded benchmarks, a copy of an ``[8, 512, 512]`` float32 tensor, its softmax
and a product with the values took 8.1-8.6 ms with the softmax written into a fresh
8 MiB tensor and 2.3-2.4 ms with it written over the copy. SDPA allocates only its
output, so this cost lands on the attention paths that write ``[B, H, T, W]``
temporaries (CoPE's band, Shaw's and CoPE's one-graph forms): at ``[1, 8, 512, 64]``,
eight runs of CoPE's one-graph form took 2.15-3.97x causal SDPA with glibc's defaults
and 2.06-2.56x with freed memory kept.

``keep_freed_memory`` sets the two thresholds (``mallopt``) so that freed memory stays
in the process, as jemalloc and tcmalloc do and as PyTorch's CPU performance guide
recommends for inference (``LD_PRELOAD`` of either, or ``MALLOC_TRIM_THRESHOLD_`` and
``MALLOC_MMAP_THRESHOLD_`` in the environment): ``posenc bench --keep-freed-memory``
measures the kernels without the allocator's faults, and says so in its record.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "keep_freed_memory"]

#: ``mallopt`` parameters (glibc's ``malloc.h``).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: Freed heap kept before a trim: 1 GiB.
TRIM_THRESHOLD = 1 << 30
#: Largest block served from the heap: glibc's maximum on 64-bit (32 MiB); larger blocks
#: are still mapped and unmapped.
MMAP_THRESHOLD = 32 << 20


def keep_freed_memory() -> str:
    """Keep freed memory in this process for the rest of its life (glibc only).

    Returns:
        A one-line description for the benchmark's record.

    Raises:
        ValueError: not glibc, or ``mallopt`` refused a value.
    """
    libc_name, _ = platform.libc_ver()
    path = ctypes.util.find_library("c")
    if libc_name != "glibc" or path is None:
        found = libc_name or "another C library"
        raise ValueError(f"--keep-freed-memory sets glibc's malloc thresholds; found {found}")
    libc = ctypes.CDLL(path)
    for option, value in ((_M_TRIM_THRESHOLD, TRIM_THRESHOLD), (_M_MMAP_THRESHOLD, MMAP_THRESHOLD)):
        if libc.mallopt(ctypes.c_int(option), ctypes.c_int(value)) != 1:
            raise ValueError(f"mallopt({option}, {value}) was refused")
    return (
        f"glibc malloc, freed memory kept: M_TRIM_THRESHOLD {TRIM_THRESHOLD}, "
        f"M_MMAP_THRESHOLD {MMAP_THRESHOLD}"
    )
