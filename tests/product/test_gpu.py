"""CUDA paths: fp16 with its GradScaler, bf16, a bit-exact resume, pinned memory, compile, a real out-of-memory
rescued and a spike rolled back from page-locked copies on the GPU. Skipped without CUDA. The GPU pass of 2026-11-27
ran them (benchmarks/gpu_pass_2026-11-27-second/); the rescue's model has since held its first allocation for
backward, so its retry fits only where the failed step's memory was freed: not yet run on a GPU."""

from __future__ import annotations

import pytest
import torch

from torchlab.core.wire.observer import TrainerObserver
from trainers import WORKLOADS, make_trainer
from torchlab.core.engine.state.checkpoint import load_checkpoint
from torchlab.core.wire.protocol import StopCommand

pytestmark = pytest.mark.gpu


def test_fp16_trains_on_cuda_with_a_grad_scaler_saved_in_checkpoints(tmp_path):
    trainer, seen = make_trainer(steps=12, device="cuda", checkpoint_dir=tmp_path, at=["4:amp=fp16", "9:amp=off"])
    assert trainer.run().status == "finished"
    assert [r.options.amp for r in seen.metrics][3:9] == ["fp16"] * 5 + ["off"]
    assert trainer.parts.precisions.state_dict() is not None  # the GradScaler is kept after switching back off
    assert load_checkpoint(tmp_path / "last.pt")["grad_scaler"]["scale"] > 0
    assert all(p.is_cuda and p.dtype == torch.float32 for p in trainer.model.parameters())


def test_bf16_and_checkpointing_on_cuda():
    trainer, seen = make_trainer(steps=6, device="cuda", options={"amp": "bf16", "checkpointing": "on", "clip": "1.0"})
    assert trainer.run().status == "finished"
    assert all(r.grad_norm_total is not None for r in seen.metrics)


def test_resume_is_bit_exact_on_cuda(tmp_path):
    settings = dict(steps=12, device="cuda", options={"amp": "bf16"})
    straight, seen_straight = make_trainer(**settings)
    straight.run()
    first, _ = make_trainer(checkpoint_dir=tmp_path, checkpoint_every=0, **settings)

    class StopAt6(TrainerObserver):
        def on_metrics(self, row):
            if row.step == 6:
                first.submit(StopCommand("test"))

    first.observers.append(StopAt6())
    first.run()
    resumed, seen_resumed = make_trainer(resume_from=tmp_path, **settings)
    resumed.run()
    assert [r.loss for r in seen_resumed.metrics] == [r.loss for r in seen_straight.metrics[6:]]


def test_pinned_memory_is_on_by_default_with_cuda_and_switches_off_and_on_at_a_step():
    untouched, seen_untouched = make_trainer(steps=8, device="cuda")
    untouched.run()
    trainer, seen = make_trainer(steps=8, device="cuda", at=["3:pin_memory=off", "6:pin_memory=on", "7:workers=1"])
    assert trainer.options.pin_memory is True  # auto, as the DataLoader always had it on CUDA
    in_use, close = [], trainer.data.close  # the loader in use at the end, before the run's end closes it
    trainer.data.close = lambda: (in_use.append((trainer.data._iterator._pin_memory, trainer.data._iterator._num_workers)),
                                  close())
    trainer.run()
    assert [r.options.pin_memory for r in seen.metrics] == [True, True, False, False, False, True, True, True]
    assert in_use == [(True, 1)]
    assert [r.loss for r in seen.metrics] == [r.loss for r in seen_untouched.metrics]


def test_compile_on_cuda_applies_at_a_step_and_resumes_with_the_models_own_keys(tmp_path):
    trainer, seen = make_trainer(steps=6, device="cuda", checkpoint_dir=tmp_path, at=["3:compile=on", "5:amp=bf16"])
    assert trainer.run().status == "finished"
    assert [event["option"] for event in seen.of("option_applied")] == ["compile", "amp"]
    assert not any("_orig_mod" in key for key in load_checkpoint(tmp_path / "last.pt")["model"])


def test_a_real_cuda_allocation_over_the_cards_memory_is_rescued_by_a_split():
    """16 samples ask for 1.33 times the card in one forward, two thirds of it held by the step's graph when the
    rest fails: CUDA's own OutOfMemoryError, the failed step's memory freed and the allocator's cache emptied, the
    step retried at split = 2 (8 samples, two thirds of the card: one third more would not fit), and the run goes
    on."""
    trainer, seen = make_trainer(f"{WORKLOADS / 'tiny.py'}:cuda_out_of_memory_above_8", steps=3, device="cuda",
                                 checkpoint_every=0, memory_every=0)
    assert trainer.run().status == "finished"
    [event] = seen.of("oom_rescued")
    assert (event["step"], event["option"], event["value"]) == (1, "split", 2) and "CUDA out of memory" in event["error"]
    assert [row.options.split for row in seen.metrics] == [2, 2, 2]


def test_a_spike_rolls_back_on_cuda_from_page_locked_copies_taken_on_a_side_stream():
    trainer, seen = make_trainer(f"{WORKLOADS / 'tiny.py'}:spike_at_step_21", steps=30, seed=3, device="cuda",
                                 options={"spike_guard": "rollback"})
    trainer.train_steps(10)
    at_10 = [tensor.clone() for tensor in trainer.model.state_dict().values()]
    trainer.train_steps(11)
    assert [(e["step"], e["rolled_back_to"]) for e in seen.of("spike_guarded")] == [(21, 10)]
    assert all(torch.equal(a, b) for a, b in zip(trainer.model.state_dict().values(), at_10))
    assert all(buffer.is_pinned() for copy in trainer.guard._copies for buffer in copy._buffers)
    trainer.train_steps(9)
    assert trainer.step == 30 and all(torch.isfinite(p).all() for p in trainer.model.parameters())


def test_on_cuda_each_phase_is_timed_by_events_on_the_stream_and_the_mfu_held_to_the_gpus_peak():
    """The slow loader's step on CUDA (20 ms in its loader, 10 ms in forward, 15 in backward, on the host: the
    device idles through each, inside the phase's events): each phase where the device spent it, read without a sync
    of its own (a row carries the steps the device had passed by its report, the last row waits for the rest), the
    phases adding up to the host's step time; the MFU held to the table's peak where the GPU is in it."""
    import statistics

    from torchlab.core.engine.measure.device_peaks import gpu_peaks

    trainer, seen = make_trainer(f"{WORKLOADS / 'tiny.py'}:slow_loader", steps=30, probe_every=10, device="cuda")
    trainer.run()
    measured = [row for row in seen.metrics if row.phases is not None]
    assert [row.step for row in measured] == [10, 20, 30] and {row.phases.clock for row in measured} == {"stream"}
    assert sum(row.phases.steps for row in measured) == 30 - 1  # every step but the counted one, each in one row
    for row in measured[1:]:  # the first holds the loader's first epoch opening
        ms = {phase: seconds * 1000 for phase, seconds in row.phases.seconds().items()}
        assert 19 <= ms["data"] < 26 and 10 <= ms["forward"] < 14 and 15 <= ms["backward"] < 19, ms
        assert 0 <= ms["other"] < 0.05 * sum(ms.values()), ms
    host_steps = statistics.mean(row.step_time_s for row in seen.metrics[10:])
    assert sum(measured[-1].phases.seconds().values()) == pytest.approx(host_steps, rel=0.15)
    known = gpu_peaks(torch.cuda.get_device_name()) is not None
    assert (measured[-1].phases.mfu is not None) == known and measured[-1].phases.flops_per_s > 0
    if known:
        assert 0 < measured[-1].phases.mfu < 0.01  # TinyNet cannot keep a GPU busy
