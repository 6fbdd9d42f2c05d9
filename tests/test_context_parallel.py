"""Context parallelism: a sequence split across ranks gives exactly the unsplit outputs
when each rank passes its own positions.

Two CPU processes (gloo) run ``tests/_cp_worker.py``: each computes the rotated q/k
(RoPE under every scaling, xPos), the bias rows of its own queries against every key
(ALiBi, T5, KERPLE, Sandwich, FIRE, Shaw, CoPE) or the input encoding of its tokens
(sinusoidal, learned) for its shard, gathers the shards with ``all_gather`` and compares
them with the one-process result, for the contiguous split and the load-balanced split
(rank ``r`` holds chunks ``r`` and ``2R-1-r``). Length-dependent scalings need the
total length pinned on every rank (``observe_length(T)``), which the worker does.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from _cp_worker import cases

WORLD = 2
WORKER = Path(__file__).with_name("_cp_worker.py")
SPLITS = ("contiguous", "balanced")
CASES = list(cases())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def errors(tmp_path_factory) -> dict[str, float]:
    out = tmp_path_factory.mktemp("cp") / "errors.json"
    port = str(_free_port())
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(rank), str(WORLD), port, str(out)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for rank in range(WORLD)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err[-3000:]
    return json.loads(out.read_text(encoding="utf-8"))


@pytest.mark.distributed
def test_every_case_ran(errors):
    assert set(errors) == {f"{case}-{split}" for case in CASES for split in SPLITS}


@pytest.mark.distributed
@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("case", CASES)
def test_sharded_outputs_equal_the_unsplit_ones(errors, case, split):
    assert errors[f"{case}-{split}"] == 0.0
