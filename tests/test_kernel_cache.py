"""The CPU RoPE kernel's cache as a trust boundary (``kernel_cache``): folders private to
the user, a lock that neither follows a link nor truncates, and a library loaded only when
it is the file this user's build recorded, checked on the descriptor that is loaded.

The planted libraries are a few lines of C whose constructor writes a marker file: no
marker means nothing planted ran. ``CXX`` names a compiler that does not exist, so no test
here compiles the kernel."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from posenc.encodings.rotary import cpu_kernel, kernel_cache
from posenc.encodings.rotary.apply import apply_rope
from posenc.reference.rope_apply_ref import rope_apply_ref

CONSTRUCTOR = """#include <stdio.h>
__attribute__((constructor)) static void ran(void) {
  FILE *f = fopen("%s", "w");
  if (f) { fputs("ran", f); fclose(f); }
}
"""
C_COMPILER = next(
    (c for c in (os.environ.get("CC"), "cc", "gcc", "clang") if c and shutil.which(c)), None
)
needs_cc = pytest.mark.skipif(C_COMPILER is None, reason="no C compiler for a planted library")


def _shared_library(folder: Path, name: str) -> tuple[Path, Path]:
    """A library whose constructor writes ``<name>.ran``; returns it and that marker."""
    marker, source = folder / f"{name}.ran", folder / f"{name}.c"
    source.write_text(CONSTRUCTOR % marker)
    library = folder / f"{name}.so"
    subprocess.run([C_COMPILER, "-shared", "-fPIC", "-o", library, source], check=True)
    return library, marker


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """An empty cache root of this test; no compiler, so nothing is ever built."""
    root = tmp_path / "cache"
    monkeypatch.setenv(cpu_kernel.ENV_CACHE, str(root))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    return root


@pytest.fixture
def planted(tmp_path, cache) -> Path:
    """A library copied where ``build()`` looks, with a record of its SHA-256 beside it:
    what anyone able to write the cache folder could leave there. Returns its marker."""
    evil, marker = _shared_library(tmp_path, "planted")
    target = cpu_kernel.library_path()
    target.parent.mkdir(parents=True)
    shutil.copy(evil, target)
    digest = hashlib.sha256(target.read_bytes()).hexdigest()
    target.with_name(target.name + ".sha256").write_text(digest)
    return marker


def _levels(cache: Path) -> dict[str, Path]:
    build = cpu_kernel.build_directory()
    return {"root": cache, "kernels": build.parent, "build folder": build}


@needs_cc
@pytest.mark.parametrize("level", ["root", "kernels", "build folder"])
@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757], ids=oct)
def test_a_library_planted_in_a_folder_others_can_write_never_runs(cache, planted, level, mode):
    folder = _levels(cache)[level]
    folder.chmod(mode)
    with pytest.raises(kernel_cache.UnsafeCache, match=f"{folder} is writable by other users"):
        cpu_kernel.build()
    assert not planted.exists()


@needs_cc
@pytest.mark.parametrize("level", ["root", "build folder"])
def test_a_symbolic_link_in_the_cache_is_refused(tmp_path, cache, planted, level):
    """Even a link to a private folder of this user: the link itself could be replaced."""
    folder = _levels(cache)[level]
    moved = tmp_path / "elsewhere"
    folder.rename(moved)
    folder.symlink_to(moved, target_is_directory=True)
    with pytest.raises(kernel_cache.UnsafeCache, match=f"{folder} is a symbolic link"):
        cpu_kernel.build()
    assert not planted.exists()


@needs_cc
@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown needs root")
def test_a_folder_of_another_user_is_refused(cache, planted):
    folder = cpu_kernel.build_directory()
    folder.chmod(0o700)
    os.chown(folder, 65534, -1)
    with pytest.raises(kernel_cache.UnsafeCache, match=f"{folder} is owned by user id 65534"):
        cpu_kernel.build()
    assert not planted.exists()


@pytest.mark.parametrize("sticky", [False, True])
def test_a_parent_folder_everyone_can_write_is_refused_unless_sticky(tmp_path, monkeypatch, sticky):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777 if sticky else 0o777)
    monkeypatch.setenv(cpu_kernel.ENV_CACHE, str(shared / "cache"))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    if sticky:  # as /tmp: nobody renames another user's folder there
        with pytest.raises(RuntimeError, match="no C\\+\\+ compiler"):
            cpu_kernel.build()
    else:
        with pytest.raises(kernel_cache.UnsafeCache, match=f"{shared} is writable by everyone"):
            cpu_kernel.build()


def test_new_cache_folders_are_private(cache):
    with pytest.raises(RuntimeError, match="no C\\+\\+ compiler"):
        cpu_kernel.build()
    for folder in _levels(cache).values():
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder


@needs_cc
@pytest.mark.parametrize("flaw", ["library writable by others", "record writable", "link"])
def test_a_library_or_record_others_could_write_is_not_loaded(tmp_path, cache, planted, flaw):
    """In a private folder, a library is still the recorded build only when it and its
    record are regular files of this user that nobody else can write."""
    library = cpu_kernel.library_path()
    if flaw == "link":
        library.rename(tmp_path / "outside.so")
        library.symlink_to(tmp_path / "outside.so")
    else:
        target = library if flaw.startswith("library") else Path(f"{library}.sha256")
        target.chmod(0o666)
    with pytest.raises(RuntimeError, match="failed its checksum and cannot be rebuilt"):
        cpu_kernel.build()
    assert not planted.exists()


@pytest.fixture
def reaches_the_lock(monkeypatch) -> None:
    """A compiler that is found, and a compilation that stops at once."""
    from torch.utils import cpp_extension

    def stop(**_):
        raise RuntimeError("compilation stopped by the test")

    monkeypatch.setattr(cpu_kernel, "_compiler_problem", lambda: None)
    monkeypatch.setattr(cpp_extension, "load", stop)


def test_the_lock_never_follows_a_link(tmp_path, cache, reaches_the_lock):
    precious = tmp_path / "precious.txt"
    precious.write_text("the user's data")
    folder = cpu_kernel.build_directory()
    folder.mkdir(parents=True, mode=0o700)
    (folder / ".posenc.lock").symlink_to(precious)
    with pytest.raises(kernel_cache.UnsafeCache, match=r"lock file .* is a symbolic link"):
        cpu_kernel.build()
    assert precious.read_text() == "the user's data"


def test_the_lock_is_created_private_and_never_truncated(cache, reaches_the_lock):
    with pytest.raises(RuntimeError, match="stopped by the test"):
        cpu_kernel.build()
    lock = cpu_kernel.build_directory() / ".posenc.lock"
    assert stat.S_IMODE(lock.stat().st_mode) == 0o600
    lock.write_text("kept")
    with pytest.raises(RuntimeError, match="stopped by the test"):
        cpu_kernel.build()
    assert lock.read_text() == "kept"


# The library is replaced right after its bytes are hashed: the descriptor hashed is what
# is loaded, so the recorded library's constructor runs and the replacement's never does.
SWAP = """
import os, sys
from pathlib import Path
from posenc.encodings.rotary import kernel_cache
folder, good, evil = (Path(p) for p in sys.argv[1:])
library = folder / good.name
hash_fd = kernel_cache._digest
def swapped(fd):
    digest = hash_fd(fd)
    os.replace(evil, library)
    return digest
kernel_cache._digest = swapped
fd = kernel_cache.open_private(folder, ())
print(kernel_cache.load_verified(fd, library))
"""


@needs_cc
@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="loads by /proc/self/fd")
def test_the_file_loaded_is_the_file_hashed(tmp_path):
    folder = tmp_path / "kernels"
    folder.mkdir(mode=0o700)
    good, good_ran = _shared_library(tmp_path, "recorded")
    evil, evil_ran = _shared_library(tmp_path, "replacement")
    kernel_cache.record(good, os.open(folder, os.O_RDONLY))
    args = [str(p) for p in (folder, folder / good.name, evil)]
    done = subprocess.run(
        [sys.executable, "-c", SWAP, *args], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"
    assert good_ran.exists() and not evil_ran.exists()


@pytest.fixture
def reload_kernel():
    """``_load`` resolved again in this test, and after it."""
    cpu_kernel._load.cache_clear()
    yield
    cpu_kernel._load.cache_clear()


def test_a_library_without_the_operator_falls_back_with_one_warning(
    tmp_path, monkeypatch, reload_kernel, gen
):
    library = tmp_path / "posenc_rope_cpu.so"
    monkeypatch.setenv(cpu_kernel.ENV_SWITCH, "1")
    monkeypatch.setattr(cpu_kernel, "build", lambda: library)  # loaded, registers nothing
    monkeypatch.setattr(torch.ops, "posenc_cpu", types.SimpleNamespace(), raising=False)
    with pytest.warns(RuntimeWarning, match=f"{library} does not register") as caught:
        status = cpu_kernel.status()
        x, angles = torch.randn(2, 3, 5, 8, generator=gen), torch.rand(5, 4, generator=gen)
        got = apply_rope(x.double(), angles.cos().double(), angles.sin().double())
    assert len(caught) == 1
    assert (
        status == f"PyTorch fallback ({library} does not register torch.ops.posenc_cpu.rope_into)"
    )
    want = rope_apply_ref(
        x.double().numpy(), angles.cos().double().numpy(), angles.sin().double().numpy()
    )
    torch.testing.assert_close(got, torch.from_numpy(want), rtol=1e-14, atol=1e-14)
