"""Smoke suite for an installed posenc (a wheel in a fresh environment, no source tree).

Usage: ``python smoke_installed.py kernel|fallback WORKDIR``; ``scripts/ci_wheel_smoke.sh``
runs it from a folder outside the source tree, once with a compiler and once without.

Checks: posenc is imported from the environment, not from a source tree; the RoPE path on
CPU is the one expected (``kernel``: compiled on first use from the packaged
``rope_cpu.cpp``; ``fallback``: the PyTorch path, named with its reason); every
registered encoding builds and runs inside ``MultiHeadAttention``; decoding with a
``KVCache`` equals the full forward (RoPE, ALiBi); ``apply_rope`` matches the float64
reference; every CLI command runs once, briefly. Exits non-zero on the first failure.
"""

from __future__ import annotations

import contextlib
import io
import sys
import time
from pathlib import Path

import torch

import posenc
from posenc.cli import main as cli
from posenc.encodings.rotary import cpu_kernel
from posenc.reference.rope_apply_ref import rope_apply_ref

C, H, T = 32, 4, 6


def check(condition: bool, what: str) -> None:
    if not condition:
        raise SystemExit(f"smoke: FAILED: {what}")
    print(f"smoke: ok: {what}")


def run_cli(*argv: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = cli(list(argv))
    check(status == 0, f"posenc {' '.join(argv)} exits 0")
    return out.getvalue()


def positions(enc: posenc.PositionalEncoding) -> torch.Tensor | None:
    index = torch.arange(T)
    if enc.position_shape == "[N, A]":  # a 2-D grid 3 wide
        return torch.stack((index // 3, index % 3), dim=-1)
    return None


def main(expect: str, work: Path) -> None:
    start = time.perf_counter()
    root = Path(posenc.__file__).resolve().parent
    check("site-packages" in root.parts, f"posenc imported from the environment ({root})")
    check((root / "encodings/rotary/rope_cpu.cpp").is_file(), "the wheel carries rope_cpu.cpp")
    check(torch.version.cuda is None, f"torch {torch.__version__} is a CPU build")
    status = cpu_kernel.status()
    want = cpu_kernel.ACTIVE if expect == "kernel" else "PyTorch fallback ("
    check(status.startswith(want), f"RoPE on CPU: {status}")

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, H, T, 8, generator=gen, dtype=torch.float64)
    angles = torch.rand(T, 4, generator=gen, dtype=torch.float64)
    got = posenc.apply_rope(x, angles.cos(), angles.sin())
    want_rope = rope_apply_ref(x.numpy(), angles.cos().numpy(), angles.sin().numpy())
    close = torch.allclose(got, torch.from_numpy(want_rope), rtol=1e-14, atol=1e-14)
    check(close, "apply_rope matches the float64 reference")

    tokens = torch.randn(2, T, C, generator=gen)
    for name in posenc.available():
        enc = posenc.build(name, d_model=C, num_heads=H, head_dim=C // H, max_len=64, causal=True)
        layer = posenc.MultiHeadAttention(C, H, position=enc).eval()
        with torch.no_grad():
            out = layer(tokens, positions(enc))
        check(out.shape == tokens.shape and bool(out.isfinite().all()), f"{name} in attention")

    for name in ("rope", "alibi"):
        torch.manual_seed(0)
        layer = posenc.MultiHeadAttention(C, H, position=name).eval()
        cache = posenc.KVCache()
        with torch.no_grad():
            full = layer(tokens)
            steps = [layer(tokens[:, :3], cache=cache)]
            steps += [layer(tokens[:, t : t + 1], cache=cache) for t in range(3, T)]
        decoded = torch.cat(steps, dim=1)
        check(torch.allclose(decoded, full, rtol=1e-5, atol=1e-5), f"{name}: KV cache = full")

    check("rope" in run_cli("list"), "posenc list names rope")
    run_cli("show", "rope", "--out", str(work / "rope.png"))
    check((work / "rope.png").stat().st_size > 0, "posenc show wrote a figure")
    run_cli("explain", "rope")
    run_cli("bench", "--quick", "--only", "rope")
    lab = ["--encodings", "rope", "alibi", "--steps", "2", "--train-len", "16", "--eval-lens", "32"]
    run_cli("lab", "--quick", *lab, "--out", str(work / "lab"), "--no-progress")
    check((work / "lab" / "results.json").is_file(), "posenc lab wrote results.json")
    with contextlib.redirect_stderr(io.StringIO()) as err:
        status = cli(["extend", str(work / "no-model")])
    check(status == 2 and err.getvalue().count("\n") == 1, "posenc extend: one error line")
    print(f"smoke: all passed ({expect}) in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
