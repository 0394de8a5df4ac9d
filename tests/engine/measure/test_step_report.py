"""A training step reports through one host transfer, read back by name (core/engine/measure/step_report.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from trainers import make_trainer
from torchlab.core.engine import trainer as trainer_module
from torchlab.core.engine.measure.step_report import HostTransfer


def test_a_host_transfer_reads_each_tensor_back_by_its_name_whatever_was_left_out():
    transfer = HostTransfer()
    transfer.add("loss", torch.tensor(2.5))
    transfer.add("grad_norm_total", None)  # not measured this step
    transfer.add("metrics", torch.tensor(True))  # any dtype: read as fp32
    transfer.add("grad_norms", torch.tensor([1.0, 2.0, 3.0]))
    transfer.add("act_stats", torch.arange(6.0).reshape(2, 3))
    host = transfer.to_host()
    assert host.scalar("loss") == 2.5
    assert host.scalar("grad_norm_total") is None and host.vector("grad_norm_total") is None
    assert host.scalar("metrics") == 1.0
    assert host.vector("grad_norms") == [1.0, 2.0, 3.0]
    assert host.vector("act_stats") == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_scalars_alone_come_back_in_one_stack_as_a_mix_comes_back_in_one_cat():
    transfer = HostTransfer()
    transfer.add("loss", torch.tensor(2.5))
    transfer.add("grad_norm_total", torch.tensor(0.75, dtype=torch.float64))
    host = transfer.to_host()
    assert host.scalar("loss") == 2.5 and host.scalar("grad_norm_total") == 0.75 and host.vector("loss") == [2.5]


# Every way a tensor's value reaches Python; on CUDA each one waits for the device.
HOST_READS = ("tolist", "item", "__float__", "__int__", "__bool__")
ENGINE = str(Path(trainer_module.__file__).parent)


@pytest.mark.parametrize("settings", [
    {},
    {"options": {"clip": "0.5", "accum": "2", "split": "2"}, "probe_every": 1, "act_stats_every": 1},
], ids=["defaults", "clip-split-probe-activations"])
def test_a_training_step_reads_the_device_once(monkeypatch, settings):
    trainer, seen = make_trainer(steps=6, **settings)
    trainer.train_steps(2)  # past the first step's set-up and the first epoch's shuffle
    reads: list[str] = []
    for name in HOST_READS:
        original = getattr(torch.Tensor, name)

        def counted(tensor, *args, _name=name, _original=original, **kwargs):
            caller = sys._getframe(1).f_code.co_filename
            if caller.startswith(ENGINE):  # the engine's own reads (AdamW reads its CPU step counter)
                reads.append(f"{_name} in {Path(caller).name}")
            return _original(tensor, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    trainer.train_steps(2)
    # One a step: a measured step's update figures travel with the next step's read, and its row waits for them
    assert reads == ["tolist in step_report.py"] * 2
    assert seen.metrics[-1].step >= 3
    assert all((row.grad_norms is None) == (row.update_ratios is None) for row in seen.metrics)
