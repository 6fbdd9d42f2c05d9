"""The ring attention script of docs/context-parallelism.md runs as written under torchrun on
two CPU processes (its own assertions compare the ring with the unsplit layer)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[1] / "docs" / "context-parallelism.md"


def _script() -> str:
    found = re.findall(r'```py title="ring_example.py"\n(.*?)```', PAGE.read_text("utf-8"), re.S)
    assert len(found) == 1, "the page has one ring_example.py"
    return found[0]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.distributed
def test_ring_example_runs_on_two_processes(tmp_path):
    script = tmp_path / "ring_example.py"
    script.write_text(_script(), encoding="utf-8")
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                "--master_addr=127.0.0.1", f"--master_port={_free_port()}"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [*launcher, str(script)], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    said = "the ring's outputs and gradients are the unsplit layer's"
    assert all(f"rank {rank}: {said}" in done.stdout for rank in range(2)), done.stdout
