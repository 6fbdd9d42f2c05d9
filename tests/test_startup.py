"""A fast start: ``import posenc`` and each command load only what they use.

Each check runs a fresh interpreter and reads its ``sys.modules``: the heavy modules
(``torch._dynamo``, about as much CPU time as ``import torch`` itself; transformers;
matplotlib; the lab's training loop; the benchmark harness) are imported only by the
code that needs them. No test times anything.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("torch._dynamo", "transformers", "matplotlib", "posenc.hf.patch")


def _loaded(code: str, *names: str) -> dict[str, bool]:
    """Which of ``names`` are in ``sys.modules`` after running ``code`` in a fresh process."""
    probe = (
        f"{code}\nimport json, sys\nprint(json.dumps({{n: n in sys.modules for n in {names!r}}}))"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "POSENC_CPU_KERNEL": "0"}
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True
    )
    return json.loads(done.stdout.splitlines()[-1])


def test_import_posenc_loads_none_of_the_heavy_modules():
    assert _loaded("import posenc", *HEAVY, "posenc.hf", "posenc.diffusers") == dict.fromkeys(
        (*HEAVY, "posenc.hf", "posenc.diffusers"), False
    )


def test_lazy_names_are_the_functions_and_posenc_hf_patch_defers_dynamo():
    loaded = _loaded(
        "import sys, posenc\n"
        "from posenc import from_hf_config\n"
        "from posenc.hf.layers import from_hf_config as direct\n"
        "assert from_hf_config is direct and posenc.from_diffusers.__name__ == 'from_diffusers'\n"
        "assert posenc.hf.patch is sys.modules['posenc.hf.patch'].patch",
        *HEAVY[:3],
    )
    assert loaded == dict.fromkeys(HEAVY[:3], False)  # posenc.hf imports its patch module


@pytest.mark.parametrize(
    ("argv", "not_loaded"),
    [
        (["--help"], (*HEAVY, "posenc.lab.runner", "posenc.viz", "posenc.bench")),
        (["lab", "--help"], (*HEAVY, "posenc.lab.runner", "posenc.viz", "posenc.bench")),
        (["list", "--markdown"], (*HEAVY, "posenc.lab", "posenc.bench", "posenc.viz")),
        (["explain", "--help"], (*HEAVY, "posenc.lab", "posenc.bench", "posenc.viz")),
    ],
)
def test_a_command_loads_only_what_it_uses(argv, not_loaded):
    code = (
        "import contextlib, io\nfrom posenc.cli import main\n"
        f"with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
        f"    main({argv!r})"
    )
    assert _loaded(code, *not_loaded) == dict.fromkeys(not_loaded, False)


@pytest.mark.parametrize("fails", [False, True])
def test_a_first_kernel_build_says_so_in_one_line(tmp_path, monkeypatch, capfd, fails):
    """The compile (here a stand-in for ``cpp_extension.load``) is announced on stderr, in
    one line that ends with the seconds it took, also when it fails."""
    from torch.utils import cpp_extension

    from posenc.encodings.rotary import cpu_kernel

    def load(*, name: str, build_directory: str, **_: object) -> None:
        if fails:
            raise RuntimeError("no compiler")
        (Path(build_directory) / f"{name}.so").write_bytes(b"library")

    monkeypatch.setattr(cpp_extension, "load", load)
    folder = os.open(tmp_path, os.O_RDONLY)
    try:
        with contextlib.nullcontext() if not fails else pytest.raises(RuntimeError):
            cpu_kernel._compile(tmp_path, folder, tmp_path / f"{cpu_kernel.NAME}.so")
    finally:
        os.close(folder)
    err = capfd.readouterr().err
    assert re.fullmatch(r"posenc: compiling the CPU RoPE kernel into \S+ \.\.\. \d+ s\n", err)
    assert (tmp_path / f"{cpu_kernel.NAME}.so").exists() is not fails


def test_the_labs_names_load_on_first_use():
    loaded = _loaded(
        "import posenc.lab as lab\n"
        "assert 'posenc.lab.runner' not in __import__('sys').modules\n"
        "from posenc.lab import LabConfig, run_lab\n"
        "from posenc.lab.runner import run_lab as direct\n"
        "assert run_lab is direct and LabConfig.__module__ == 'posenc.lab.config'\n"
        "assert set(lab.__all__) <= set(dir(lab))\n"
        "try:\n    lab.nothing\nexcept AttributeError as e:\n    assert 'nothing' in str(e)\n"
        "else:\n    raise SystemExit('no AttributeError')",
        "posenc.lab.runner",
    )
    assert loaded == {"posenc.lab.runner": True}
