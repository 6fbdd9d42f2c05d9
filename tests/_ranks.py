"""Launch one test worker script as several gloo ranks on this machine.

``run_ranks(worker, world, *args)`` starts ``python worker RANK WORLD PORT OUT.json *args``
for each rank (``OMP_NUM_THREADS=1``, a free port), waits for all of them with a timeout so
that a failure never hangs the suite, and returns the JSON rank 0 wrote; a worker may write it
with ``write_gathered`` and ends with ``finish``. ``torchrun(n, *argv)`` runs a command under
``torch.distributed.run`` with ``n`` processes (a module's ``-m`` or a script), as users
launch it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun(nproc: int, *argv: str, timeout: float = 400) -> subprocess.CompletedProcess:
    """``python -m torch.distributed.run --nproc_per_node=nproc *argv`` on a free local port,
    one thread per process; its output captured as text."""
    launcher = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
                "--master_addr=127.0.0.1", f"--master_port={free_port()}"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [*launcher, *argv], capture_output=True, text=True, env=env, timeout=timeout
    )


def run_ranks(worker: Path, world: int, *args: str, timeout: float = 300) -> object:
    """Run ``world`` ranks of ``worker``; raise ``AssertionError`` with a failed rank's
    stderr, or ``subprocess.TimeoutExpired`` (after killing every rank) past ``timeout``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        port = str(free_port())
        procs = [
            subprocess.Popen(
                [sys.executable, str(worker), str(rank), str(world), port, str(out), *args],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
            for rank in range(world)
        ]
        try:
            for rank, proc in enumerate(procs):
                _, err = proc.communicate(timeout=timeout)
                assert proc.returncode == 0, f"rank {rank} failed:\n{err[-3000:]}"
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.communicate()
        return json.loads(out.read_text(encoding="utf-8"))


def write_gathered(found: object, out: Path) -> None:
    """Worker side: gather every rank's ``found`` (JSON-able) on rank 0, which writes the list."""
    import torch.distributed as dist

    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, found)
    if dist.get_rank() == 0:
        out.write_text(json.dumps(gathered), encoding="utf-8")


def finish() -> None:
    """Worker side, after rank 0 wrote its output: a barrier, the process group destroyed,
    and the process ended without interpreter shutdown (``os._exit(0)``, stdio flushed).

    A ``DeviceMesh`` keeps its gloo group alive after ``destroy_process_group`` (PyTorch
    2.13), so the group's worker threads outlive it into interpreter shutdown. A thread that
    then drops the last collective's tensors (owned by Python: an ``all_gather_object``'s)
    needs the GIL, is ended by the finalizing interpreter and aborts the process ("terminate
    called without an active exception"; gdb: ``pt_gloo_runloop`` in ``THPVariable_dealloc``
    -> ``take_gil`` -> ``pthread_exit``): 4 of 40 runs of the torchtitan worker here, about 1
    in 100 with the barrier alone, 0 of 60 with this.
    """
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
