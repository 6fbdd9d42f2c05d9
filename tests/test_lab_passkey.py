"""The passkey task's key length: the examples it makes, the option that sets it, and
the workload that uses it."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.lab import LabConfig, Task
from posenc.lab.config import PASSKEY_KEY_LEN
from posenc.lab.distributed import Context
from posenc.lab.tasks import DEPTHS, IGNORE, KEY_LEN
from posenc.lab.workload import make_workload

KEY, QUERY = 18, 19  # the marks after 2 special ids, 10 digits and 6 filler ids


@settings(max_examples=25, deadline=None)
@given(key_len=st.integers(1, 6), length=st.integers(16, 64), seed=st.integers(0, 1000))
def test_a_passkey_example_hides_the_key_and_asks_for_it(key_len, length, seed):
    task = Task("passkey", 64, key_len=key_len)
    inputs, targets = task.batch(len(DEPTHS), length, torch.Generator().manual_seed(seed),
                                 exact=True)  # fmt: skip
    assert task.size(length) == length + 1 - 2 * (key_len + 1)
    for row, depth in enumerate(DEPTHS):
        x, y = inputs[row], targets[row]
        assert x.numel() == length and int((x == KEY).sum()) == int((x == QUERY).sum()) == 1
        at = int((x == KEY).nonzero())
        assert at == round(depth * task.size(length))  # filler before the key
        key = x[at + 1 : at + 1 + key_len]
        assert bool(((key >= 2) & (key < 12)).all())  # digits
        scored = y != IGNORE
        assert int(scored.sum()) == key_len
        assert torch.equal(y[scored], key)  # the key, predicted after Q
        assert int(scored.nonzero()[0]) == int((x == QUERY).nonzero())


def test_the_key_length_is_an_option_of_the_sweep():
    assert LabConfig().passkey_key_len == PASSKEY_KEY_LEN == 2 < KEY_LEN  # the lab's default
    assert Task("passkey", 64).key_len == KEY_LEN  # the task's own
    config = LabConfig(task="passkey", train_len=16, eval_lens=(16, 32), passkey_key_len=2,
                       d_model=16, num_heads=2)  # fmt: skip
    work = make_workload(config, Context())
    _, targets = work.sampler(16, 0)(32)
    assert ((targets != IGNORE).sum(1) == 2).all()
    assert "passkey_key_len" in config.identity(None)
    assert "passkey_key_len" not in LabConfig().identity(None)  # text: not a setting
    with pytest.raises(ValueError, match="passkey_key_len"):
        LabConfig(task="passkey", train_len=16, eval_lens=(16,), passkey_key_len=0)
    with pytest.raises(ValueError, match="key_len"):
        Task("passkey", 64, key_len=0)
    with pytest.raises(ValueError, match="cannot make examples of length 8"):
        Task("passkey", 64, key_len=5).batch(1, 8, torch.Generator(), exact=True)
