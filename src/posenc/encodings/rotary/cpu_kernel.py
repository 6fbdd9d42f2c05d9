"""The compiled CPU kernel behind ``apply_rope``: build it once, load it, call it.

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head_dim, ``R`` rotary dim.
``rope_cpu.cpp`` rotates every row of ``x [B, H, T, D]`` in one pass (read once, write
once, any strides, in place or not) with ``at::parallel_for``
over rows; float32, float64, bfloat16 and float16, half precision rotated in float32
and rounded once. It is compiled ahead of time by ``python -m
posenc.encodings.rotary.build_kernel`` (``scripts/setup.sh`` runs it; a few seconds
with g++) into a shared library beside this file whose name carries the torch version
and a hash of the source, so a stale or foreign build is never loaded. Nothing compiles
at run time: when the library is missing, fails to load, or ``POSENC_CPU_KERNEL=0`` is
set, ``apply_rope`` runs its PyTorch implementation instead, and ``status()`` (shown by
``posenc --version`` and ``posenc bench``) says which path is active and why.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import re
import subprocess
import tempfile
from pathlib import Path

import torch
from torch import Tensor

__all__ = ["build", "library_path", "rotate", "status"]

SOURCE = Path(__file__).with_name("rope_cpu.cpp")
ENV_SWITCH = "POSENC_CPU_KERNEL"
_DTYPE_CODES = {torch.float32: 0, torch.float64: 1, torch.bfloat16: 2, torch.float16: 3}
_Int64x4 = ctypes.c_int64 * 4


def library_path() -> Path:
    """Where the library built from this source for this torch version lives."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    torch_tag = re.sub(r"[^A-Za-z0-9]+", "_", torch.__version__)
    return SOURCE.with_name(f"_rope_cpu_torch{torch_tag}_{digest}.so")


def build(*, compiler: str = "g++") -> Path:
    """Compile ``rope_cpu.cpp`` against the installed torch; returns the library's path.

    The library is written to a temporary file and renamed into place, so a failed or
    interrupted build never leaves a broken library behind.

    Raises:
        RuntimeError: the compiler is missing or reports an error (its output included).
    """
    target = library_path()
    torch_root = Path(torch.__file__).parent  # the wheel ships headers and libraries
    lib_dir = torch_root / "lib"
    includes = [f"-I{torch_root / 'include'}"]
    links = [f"-L{lib_dir}", f"-Wl,-rpath,{lib_dir}"]
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    command = [compiler, "-O3", "-std=c++17", "-shared", "-fPIC", "-fopenmp", *includes]
    command += [str(SOURCE), "-o", tmp, *links, "-ltorch_cpu", "-lc10"]
    try:
        result = subprocess.run(command, capture_output=True, text=True, check=False)
    except OSError as err:
        os.unlink(tmp)
        raise RuntimeError(f"cannot run the C++ compiler {compiler!r}: {err}") from err
    if result.returncode != 0:
        os.unlink(tmp)
        raise RuntimeError(f"{compiler} failed to build {SOURCE.name}:\n{result.stderr}")
    os.chmod(tmp, 0o755)
    os.replace(tmp, target)
    return target


@functools.cache
def _load() -> tuple[ctypes._CFuncPtr | None, str]:
    """The kernel's entry point, or ``None`` with the reason it is not available."""
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return None, f"disabled by {ENV_SWITCH}=0"
    path = library_path()
    if not path.is_file():
        return None, "not built (run: python -m posenc.encodings.rotary.build_kernel)"
    try:
        func = ctypes.CDLL(str(path)).posenc_rope
    except (OSError, AttributeError) as err:
        return None, f"failed to load {path.name}: {err}"
    func.argtypes = [ctypes.c_int] + [ctypes.c_void_p] * 4 + [ctypes.POINTER(ctypes.c_int64)] * 3
    func.argtypes += [ctypes.c_int64, ctypes.c_int64, ctypes.c_int]
    func.restype = ctypes.c_int
    return func, "compiled C++ kernel"


def status() -> str:
    """Which RoPE path runs on CPU tensors: the compiled kernel, or the fallback and why."""
    func, reason = _load()
    return reason if func is not None else f"PyTorch fallback ({reason})"


def rotate(out: Tensor, x: Tensor, cos: Tensor, sin: Tensor, *, interleaved: bool) -> bool:
    """Write the rotation of ``x`` into ``out`` (``out is x``: in place) if the kernel can.

    Args:
        out: ``[B, H, T, D]``, ``x`` itself or a tensor that does not overlap it.
        x: ``[B, H, T, D]``, checked by the caller.
        cos: ``[T, R/2]`` or ``[B|1, 1, T, R/2]`` in the compute dtype (float32, or
            float64 for float64 ``x``), as ``apply._tables`` returns them.
        sin: the same shape as ``cos`` (``-sin`` for the inverse rotation).
        interleaved: pair layout.

    Returns:
        ``True`` when the kernel wrote ``out``; ``False`` (nothing written) when it is
        unavailable or the inputs are not CPU tensors of a floating dtype it handles.
    """
    func, _ = _load()
    code = _DTYPE_CODES.get(x.dtype)
    if func is None or code is None or x.device.type != "cpu" or out.device.type != "cpu":
        return False
    half = cos.shape[-1]
    cos = cos.reshape(-1, x.shape[2], half).contiguous()  # [B|1, T, R/2]
    sin = sin.reshape(-1, x.shape[2], half).contiguous()
    status_code = func(
        code,
        x.data_ptr(),
        out.data_ptr(),
        cos.data_ptr(),
        sin.data_ptr(),
        _Int64x4(*x.shape),
        _Int64x4(*x.stride()),
        _Int64x4(*out.stride()),
        2 * half,
        cos.shape[0],
        int(interleaved),
    )
    return status_code == 0
