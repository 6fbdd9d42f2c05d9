"""The CPU RoPE kernel's cache folder as a trust boundary.

Loading a shared library runs its constructors, so whoever can write the library posenc
loads runs code in every process that rotates on the CPU. ``cpu_kernel`` therefore
reaches its build folder (``<cache>/kernels/<name>``) only through this module:

- every folder from the cache root down is created with mode 0700 where missing, and is
  opened without following a symbolic link (``O_NOFOLLOW``) and checked on the open
  descriptor: a folder owned by another user, writable by its group or by others, or a
  link is refused (``UnsafeCache``). Each level is opened relative to the one above it,
  so a folder renamed or replaced after its check is never the one used. The folders
  above the root (``~/.cache``, ``/tmp``) may not be owned by another user (root
  excepted) nor writable by everyone unless sticky;
- the build lock is opened without following a link and without truncating
  (``O_CREAT | O_NOFOLLOW``, mode 0600) inside the checked folder;
- the library is loaded only when it is the file a build of this user recorded: the
  library and its ``.sha256`` record are opened without following a link, must be
  regular files of this user that nobody else can write (in a folder nobody else can
  write), and the SHA-256 is computed from the open descriptor, which is the file loaded
  (``/proc/self/fd/N`` on Linux), so the bytes checked are the bytes mapped.

A build goes into a fresh private folder beside the library and is renamed into place
with its record, so a half-written library never carries a record.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import torch

__all__ = ["UnsafeCache", "load_verified", "locked", "open_private", "record"]

_FLAGS = getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _FLAGS
_LOCK = ".posenc.lock"


class UnsafeCache(RuntimeError):
    """A cache folder or file that another user could have written: never read."""


def _owner_problem(info: os.stat_result) -> str | None:
    """Why a folder or file inside the cache cannot be trusted, or ``None``."""
    if info.st_uid != os.geteuid():
        return f"is owned by user id {info.st_uid}, not by you ({os.geteuid()})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by other users (mode {stat.filemode(info.st_mode)})"
    return None


def _check_above(root: Path) -> None:
    """Refuse a folder above the cache root that another user can rename entries in."""
    for folder in root.parents:
        info = os.stat(folder)
        mode = stat.filemode(info.st_mode)
        if info.st_uid not in (0, os.geteuid()):
            problem = f"is owned by user id {info.st_uid}"
        elif info.st_mode & stat.S_IWOTH and not info.st_mode & stat.S_ISVTX:
            problem = f"is writable by everyone without the sticky bit (mode {mode})"
        else:
            continue
        raise UnsafeCache(f"the kernel cache's parent folder {folder} {problem}")


def _is_link(name: str, parent: int | None) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _open_folder(name: str, parent: int | None, shown: Path) -> int:
    """A descriptor on folder ``name`` (in ``parent``; a path when ``None``), created 0700."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, 0o700, dir_fd=parent)
    try:
        fd = os.open(name, _DIRECTORY, dir_fd=parent)
    except OSError as err:
        kind = "a symbolic link" if _is_link(name, parent) else f"not openable ({err.strerror})"
        raise UnsafeCache(f"the kernel cache folder {shown} is {kind}") from None
    info = os.fstat(fd)
    problem = _owner_problem(info)
    if problem is None and not stat.S_ISDIR(info.st_mode):
        problem = "is not a folder"
    if problem is not None:
        os.close(fd)
        raise UnsafeCache(f"the kernel cache folder {shown} {problem}")
    return fd


def open_private(root: Path, parts: tuple[str, ...]) -> int:
    """A descriptor on ``root / parts...``, each level created 0700 or checked.

    Raises:
        UnsafeCache: a level is a symbolic link, owned by another user or writable by
            other users, or a folder above ``root`` is owned by another user or writable
            by everyone without the sticky bit.
        RuntimeError: no POSIX file ownership (Windows).
        OSError: a folder cannot be created.
    """
    if not hasattr(os, "geteuid") or not hasattr(os, "O_NOFOLLOW"):
        raise RuntimeError("the kernel cache needs POSIX file ownership and O_NOFOLLOW")
    root = Path(os.path.abspath(root))
    root.parent.mkdir(parents=True, exist_ok=True)
    _check_above(root)
    fd = _open_folder(str(root), None, root)
    shown = root
    for part in parts:
        shown = shown / part
        try:
            child = _open_folder(part, fd, shown)
        finally:
            os.close(fd)
        fd = child
    return fd


@contextlib.contextmanager
def locked(folder: int, shown: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``folder`` (released when the process dies).

    The lock file is created 0600 and opened without following a link or truncating.
    """
    import fcntl

    try:
        fd = os.open(_LOCK, os.O_RDWR | os.O_CREAT | _FLAGS, 0o600, dir_fd=folder)
    except OSError as err:
        kind = "a symbolic link" if err.errno == errno.ELOOP else f"not openable ({err.strerror})"
        raise UnsafeCache(f"the kernel's lock file {shown / _LOCK} is {kind}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _open_file(name: str, folder: int) -> int | None:
    """A descriptor on regular file ``name`` of this user that nobody else can write."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | _FLAGS, dir_fd=folder)
    except OSError:
        return None  # missing, or a link: not the recorded build
    info = os.fstat(fd)
    if _owner_problem(info) is not None or not stat.S_ISREG(info.st_mode):
        os.close(fd)
        return None
    return fd


def _digest(fd: int) -> str:
    digest = hashlib.sha256()
    os.lseek(fd, 0, os.SEEK_SET)
    while chunk := os.read(fd, 1 << 20):
        digest.update(chunk)
    return digest.hexdigest()


def _record_name(library: str) -> str:
    return library + ".sha256"


def _recorded(name: str, folder: int) -> str | None:
    fd = _open_file(_record_name(name), folder)
    if fd is None:
        return None
    try:
        return os.read(fd, 256).decode("ascii", "replace").strip()
    finally:
        os.close(fd)


def load_verified(folder: int, library: Path) -> bool:
    """Load ``library`` (in ``folder``) when it is the file its build recorded.

    Returns:
        ``True`` when loaded; ``False`` (nothing loaded) when the library or its record
        is missing, a link, another user's, writable by others, or the digests differ.
    """
    want = _recorded(library.name, folder)
    fd = _open_file(library.name, folder)
    if fd is None:
        return False
    try:
        if want is None or _digest(fd) != want:
            return False
        # The descriptor, not the name: the file loaded is the file hashed. (torch.ops.
        # load_library would resolve the descriptor's link back to the name.) The loader
        # knows the library by this name: a later load of the same name in this process
        # (a library hashed again) returns it, and one without the operator falls back.
        by_descriptor = f"/proc/self/fd/{fd}"
        ctypes.CDLL(by_descriptor if os.path.exists(by_descriptor) else str(library))
        torch.ops.loaded_libraries.add(str(library))
        return True
    finally:
        os.close(fd)


def record(built: Path, folder: int) -> None:
    """Move the freshly built library ``built`` into ``folder`` with its digest record
    (each renamed into place, so a reader sees an old or a whole new file)."""
    name = built.name
    fd = os.open(built, os.O_RDONLY | _FLAGS)
    try:
        digest = _digest(fd)
    finally:
        os.close(fd)
    temporary = _record_name(name) + ".tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(temporary, dir_fd=folder)
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _FLAGS, 0o600, dir_fd=folder)
    try:
        os.write(fd, digest.encode("ascii"))
    finally:
        os.close(fd)
    os.replace(built, name, dst_dir_fd=folder)
    os.replace(temporary, _record_name(name), src_dir_fd=folder, dst_dir_fd=folder)
