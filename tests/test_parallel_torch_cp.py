"""Where PyTorch's own context parallelism runs on the CPU (docs/context-parallelism.md says so):
two gloo ranks, torch's head-tail load balancing.

* ``context_parallel`` around ``scaled_dot_product_attention`` raises: the CPU SDPA kernel has
  no context-parallel rule (only the CUDA flash, efficient and cuDNN kernels do);
* the FlexAttention style gathers keys and values, and an ALiBi ``score_mod`` that reads the
  positions of posenc's layouts gives the unsplit attention (float32, eager FlexAttention).

Slow (about 100 s on two busy cores): torch compiles ``create_block_mask`` to shard the mask;
``.ci/run`` runs it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from _ranks import run_ranks

WORKER = Path(__file__).with_name("_torch_cp_worker.py")


@pytest.fixture(scope="module")
def findings():
    return run_ranks(WORKER, 2)


@pytest.mark.slow
@pytest.mark.distributed
def test_sdpa_context_parallel_does_not_run_on_the_cpu(findings):
    for found in findings:
        assert "_scaled_dot_product_flash_attention_for_cpu" in found["sdpa_error"]
        assert "does not have a sharding strategy registered" in found["sdpa_error"]


@pytest.mark.slow
@pytest.mark.distributed
def test_flex_context_parallel_with_a_positional_score_mod_equals_unsplit(findings):
    eps = torch.finfo(torch.float32).eps
    for found in findings:
        assert found["flex_difference"] < 64 * eps  # float32: a softmax, then 8-term products
