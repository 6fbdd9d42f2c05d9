"""The compiled CPU kernel behind ``apply_rope``: build it once, load it, call it.

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head_dim, ``R`` rotary dim.
``rope_cpu.cpp`` (shipped inside the package) rotates every row of ``x [B, H, T, D]``
in one pass (read once, write once, any strides, in place or not) with
``at::parallel_for`` over rows; float32, float64, bfloat16 and float16, half precision
rotated in float32 and rounded once. It registers the operator
``torch.ops.posenc_cpu.rope_into`` for CPU tensors.

When it is built: on first use (the first CPU ``apply_rope``, ``posenc --version``, or
``python -m posenc.encodings.rotary.build_kernel``, which the set-up runs), by
``torch.utils.cpp_extension`` (a C++ compiler and ninja; about 10 s), into the user's
cache directory: ``$POSENC_CACHE_DIR``, else ``$XDG_CACHE_HOME/posenc``, else
``~/.cache/posenc``, under ``kernels/`` in a folder whose name carries the torch and
Python versions, the machine and a hash of the source, the flags and the CPU, so a stale
or foreign build is never loaded. On x86-64 it is compiled for the CPU it runs on
(``-march=native``: AVX-512 or AVX2 where present, instead of the SSE2 baseline), which
is why the CPU's model and feature flags are part of the hash: a cache directory shared
by different machines holds one build per CPU. Loading a library runs its code, so the
cache is a trust boundary (``kernel_cache``): its folders are private to the user
(created 0700; a folder another user owns or can write, or a link, is refused with one
warning), and a library is loaded only when it is the file a build recorded, checked on
the open file that is then loaded: a truncated or altered file is rebuilt, or, where it
cannot be, left alone. Builds take a lock (a file that is never truncated nor followed
through a link), so processes starting together build once, and go into a fresh private
folder from which the library and its record are renamed into place.

When the kernel is off, missing a compiler, failing to build or to load (for any
reason), or ``POSENC_CPU_KERNEL=0`` is set, ``apply_rope`` runs its PyTorch path, and
``status()`` (shown by ``posenc --version`` and ``posenc bench``) says so and why.
``POSENC_KERNEL_CFLAGS`` adds compiler flags (CI builds one with
``-fsanitize=address,undefined``); they are part of the folder's hash.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from posenc.encodings.rotary import kernel_cache

__all__ = ["build", "build_directory", "library_path", "rotate", "status"]

SOURCE = Path(__file__).with_name("rope_cpu.cpp")
ENV_SWITCH = "POSENC_CPU_KERNEL"
ENV_CACHE = "POSENC_CACHE_DIR"
ENV_CFLAGS = "POSENC_KERNEL_CFLAGS"
ACTIVE = "compiled C++ kernel"
NAME = "posenc_rope_cpu"
# No fused multiply-add, so the bits are PyTorch's: -ffp-contract=off, and no SLP
# vectorizer, which (GCC 12) turns the interleaved pairs' products and add/sub into
# vfmaddsub even so.
_BASE_FLAGS = ("-O3", "-fopenmp", "-ffp-contract=off", "-fno-tree-slp-vectorize")
_NATIVE = ("-march=native",) if platform.machine().lower() in ("x86_64", "amd64") else ()
_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def _flags() -> list[str]:
    return [*_BASE_FLAGS, *_NATIVE, *os.environ.get(ENV_CFLAGS, "").split()]


def _cpu_identity() -> str:
    """The CPU a native build is for: model name and feature flags (Linux), else the
    processor string."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            fields = {}
            for line in f:
                key, _, value = line.partition(":")
                if not line.strip():
                    break  # the first processor is enough
                fields[key.strip()] = value.strip()
        return f"{fields.get('model name', '')}|{fields.get('flags', '')}"
    except OSError:
        return platform.processor()


def cache_directory() -> Path:
    """The user's cache directory for posenc (``$POSENC_CACHE_DIR``, XDG, ``~/.cache``)."""
    if os.environ.get(ENV_CACHE):
        return Path(os.environ[ENV_CACHE])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "posenc"


def build_directory() -> Path:
    """Where the kernel built from this source, torch, Python, flags and CPU lives."""
    digest = hashlib.sha256(SOURCE.read_bytes())
    digest.update(" ".join(_flags()).encode())
    digest.update(_cpu_identity().encode())
    tag = f"torch{torch.__version__}-py{sys.version_info[0]}{sys.version_info[1]}"
    tag = "".join(c if c.isalnum() or c in "-." else "_" for c in tag)
    name = f"rope_cpu-{tag}-{platform.machine()}-{digest.hexdigest()[:12]}"
    return cache_directory() / "kernels" / name


def library_path() -> Path:
    """The kernel's shared library (which may not be built yet)."""
    return build_directory() / f"{NAME}.so"


def _compiler_problem() -> str | None:
    """Why ``torch.utils.cpp_extension`` cannot build here, or ``None``."""
    from torch.utils import cpp_extension

    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return f"no C++ compiler: {compiler!r} not found (set CXX)"
    if not cpp_extension.is_ninja_available():
        return "ninja not found (pip install ninja)"
    return None


def _compile(directory: Path, folder: int, library: Path) -> None:
    """Compile the kernel in a fresh private folder inside ``directory`` (loading it),
    then rename it and its digest record into ``directory`` (open as ``folder``)."""
    from torch.utils import cpp_extension

    scratch = Path(tempfile.mkdtemp(prefix=".build-", dir=directory))
    start = time.monotonic()  # one line on stderr: a first build takes 10 s to minutes
    print(f"posenc: compiling the CPU RoPE kernel into {directory} ...", end="", file=sys.stderr)
    try:
        flags = _flags()
        sanitizers = [f for f in flags if f.startswith("-fsanitize")]
        cpp_extension.load(
            name=NAME,
            sources=[str(SOURCE)],
            extra_cflags=flags,
            extra_ldflags=sanitizers,
            build_directory=str(scratch),
            is_python_module=False,
            verbose=False,
        )
        torch.ops.loaded_libraries.discard(os.path.realpath(scratch / library.name))
        kernel_cache.record(scratch / library.name, folder)
    finally:
        print(f" {time.monotonic() - start:.0f} s", file=sys.stderr)
        shutil.rmtree(scratch, ignore_errors=True)


def build() -> Path:
    """Build the kernel if no verified build exists, and load it into this process.

    Returns:
        The library's path.

    Raises:
        kernel_cache.UnsafeCache: a cache folder that another user owns or can write,
            or a link where a folder or the lock should be (nothing there is read).
        RuntimeError: no compiler or ninja, a failed build (the compiler's message
            included), a source file missing from the installation, or a library that
            fails to load.
    """
    if not SOURCE.is_file():
        raise RuntimeError(f"{SOURCE.name} is missing from the installed package")
    directory = build_directory()
    library = directory / f"{NAME}.so"
    root = cache_directory()
    folder = kernel_cache.open_private(root, directory.relative_to(root).parts)
    try:
        if kernel_cache.load_verified(folder, library):
            return library
        problem = _compiler_problem()
        if problem is not None:
            if os.path.lexists(library):
                problem = f"{library} failed its checksum and cannot be rebuilt: {problem}"
            raise RuntimeError(problem)
        with kernel_cache.locked(folder, directory):
            if not kernel_cache.load_verified(folder, library):  # nobody built it meanwhile
                _compile(directory, folder, library)
                if not kernel_cache.load_verified(folder, library):
                    raise RuntimeError(f"{library} does not match the digest its build recorded")
    finally:
        os.close(folder)
    return library


def _one_line(err: Exception) -> str:
    return (" ".join(str(err).split()) or type(err).__name__)[:400]


def _fallback(reason: str) -> tuple[None, str]:
    """The PyTorch path, with one warning that says why."""
    message = f"posenc: the CPU RoPE kernel is not loaded ({reason}); the PyTorch path runs"
    warnings.warn(message, RuntimeWarning, stacklevel=3)
    return None, reason


@functools.cache
def _load() -> tuple[Callable[..., None] | None, str]:
    """The kernel's operator, or ``None`` with the reason it is not available."""
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return None, f"disabled by {ENV_SWITCH}=0"
    try:
        library = build()
    except kernel_cache.UnsafeCache as err:
        return _fallback(_one_line(err))
    except Exception as err:  # any failure means the PyTorch path, never a dead process
        return None, _one_line(err)
    try:
        return torch.ops.posenc_cpu.rope_into, ACTIVE
    except Exception:  # a library without the operator: the PyTorch path, not a traceback
        return _fallback(f"{library} does not register torch.ops.posenc_cpu.rope_into")


def status() -> str:
    """Which RoPE path runs on CPU tensors: the compiled kernel, or the fallback and why."""
    func, reason = _load()
    return reason if func is not None else f"PyTorch fallback ({reason})"


def rotate(out: Tensor, x: Tensor, cos: Tensor, sin: Tensor, *, interleaved: bool) -> bool:
    """Write the rotation of ``x`` into ``out`` (``out is x``: in place) if the kernel can.

    Args:
        out: ``[B, H, T, D]``, ``x`` itself or a fresh tensor that does not overlap it.
        x: ``[B, H, T, D]``, checked by the caller: a strided tensor without lazy
            negation or zero bits whose elements do not overlap when ``out is x``.
        cos: ``[T, R/2]`` or ``[B|1, 1, T, R/2]`` in the compute dtype (float32, or
            float64 for float64 ``x``), not sharing memory with ``out``.
        sin: the same shape as ``cos`` (``-sin`` for the inverse rotation).
        interleaved: pair layout.

    Returns:
        ``True`` when the kernel wrote ``out``; ``False`` (nothing written) when it is
        unavailable or the inputs are not CPU tensors of a floating dtype it handles.
    """
    if x.dtype not in _DTYPES or x.device.type != "cpu" or out.device.type != "cpu":
        return False
    func, _ = _load()
    if func is None:
        return False
    half = cos.shape[-1]
    cos = cos.reshape(-1, x.shape[2], half).contiguous()  # [B|1, T, R/2]
    sin = sin.reshape(-1, x.shape[2], half).contiguous()
    func(x, out, cos, sin, interleaved)
    return True
