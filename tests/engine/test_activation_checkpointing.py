"""Activation checkpointing changes memory and speed, never the numbers."""

from __future__ import annotations

import torch

from trainers import make_trainer
from torchlab.core.engine.activation_checkpointing import ActivationCheckpointing, default_checkpoint_blocks
from torchlab.core.engine.seeding import seed_everything
from torchlab.sample_models import convnet, tiny_gpt

SMALL_GPT = dict(d_model=32, n_layers=3, n_heads=2, context_length=16, num_train=64, num_val=16)
SMALL_CONVNET = dict(stem_channels=4, stage_channels=(8, 8), num_train=64, num_val=16)


def gradients_after_one_step(workload, checkpointing: bool, seed: int = 0):
    model = workload.model
    model.train()
    manager = ActivationCheckpointing(model, workload.checkpoint_blocks)
    if checkpointing:
        manager.enable()
    batch = next(iter(torch.utils.data.DataLoader(workload.dataset, batch_size=8)))
    torch.manual_seed(seed)  # same dropout masks in both runs
    workload.loss_fn(model, batch).backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    buffers = {name: b.clone() for name, b in model.named_buffers()}
    manager.disable()
    return grads, buffers


def test_gpt_with_dropout_has_equal_gradients_with_and_without_checkpointing():
    seed_everything(0)
    reference = tiny_gpt.make_workload(**SMALL_GPT)
    seed_everything(0)
    wrapped = tiny_gpt.make_workload(**SMALL_GPT)
    assert default_checkpoint_blocks(wrapped.model) == [f"blocks.{i}" for i in range(len(wrapped.model.blocks))]
    plain_grads, _ = gradients_after_one_step(reference, checkpointing=False)
    ckpt_grads, _ = gradients_after_one_step(wrapped, checkpointing=True)
    assert plain_grads.keys() == ckpt_grads.keys()
    for name in plain_grads:
        torch.testing.assert_close(ckpt_grads[name], plain_grads[name], rtol=1e-5, atol=1e-6, msg=name)


def test_batchnorm_statistics_update_once_per_step_under_checkpointing():
    seed_everything(0)
    reference = convnet.make_workload(**SMALL_CONVNET)
    seed_everything(0)
    wrapped = convnet.make_workload(**SMALL_CONVNET)
    plain_grads, plain_buffers = gradients_after_one_step(reference, checkpointing=False)
    ckpt_grads, ckpt_buffers = gradients_after_one_step(wrapped, checkpointing=True)
    for name in plain_grads:
        torch.testing.assert_close(ckpt_grads[name], plain_grads[name], rtol=1e-5, atol=1e-6, msg=name)
    assert any("running_mean" in name for name in plain_buffers)
    for name in plain_buffers:
        torch.testing.assert_close(ckpt_buffers[name], plain_buffers[name], msg=name)


def test_checkpointed_blocks_really_recompute_in_backward():
    seed_everything(0)
    workload = tiny_gpt.make_workload(**SMALL_GPT)
    manager = ActivationCheckpointing(workload.model, None)
    calls = []
    first_block = next(iter(manager.blocks.values()))
    handle = first_block.register_forward_hook(lambda *args: calls.append(torch.is_grad_enabled()))
    manager.enable()
    batch = next(iter(torch.utils.data.DataLoader(workload.dataset, batch_size=2)))
    workload.loss_fn(workload.model, batch).backward()
    handle.remove()
    assert len(calls) == 1  # the block's own hook fires once: the wrapper runs inside it ...
    inner_calls = []
    inner = next(iter(first_block.children()))
    inner.register_forward_hook(lambda *args: inner_calls.append(1))
    workload.loss_fn(workload.model, batch).backward()
    assert len(inner_calls) == 2  # ... and its submodules run twice: forward, then the recompute
    manager.disable()
    inner_calls.clear()
    workload.loss_fn(workload.model, batch).backward()
    assert len(inner_calls) == 1


def test_named_blocks_alone_are_checkpointed_and_a_name_the_model_lacks_is_refused_leaving_them():
    trainer, seen = make_trainer(steps=4, at=["2:checkpointing=body.2,body.0", "3:checkpointing=body.1,head"])
    trainer.run()
    assert trainer.parts.model.checkpointing.wrapped_names() == ["body.0", "body.2"]
    [refused] = seen.of("option_refused")
    assert refused["reason"] == "head is not among this model's checkpoint blocks (body.0, body.1, body.2)"
    assert [row.options.checkpointing for row in seen.metrics] == [False, "body.2,body.0", "body.2,body.0", "body.2,body.0"]


def test_a_block_that_recomputes_otherwise_turns_checkpointing_off_and_the_step_is_retried_without_it():
    """Its forward depends on a state it changes: under checkpointing its recomputation saves other tensors than its
    forward did (CheckpointError), which ended the run. The step is now retried without checkpointing, which stays
    off for the model (turning it on again is refused, saying why), and training is that of a run without it."""
    from trainers import TINY, make_trainer

    spec = TINY.replace(":workload", ":recomputes_otherwise")
    plain, seen_plain = make_trainer(spec, steps=6)
    plain.run()
    trainer, seen = make_trainer(spec, steps=6, at=["3:checkpointing=on", "5:checkpointing=on"])
    assert trainer.run().status == "finished"
    applied = [(event["step"], event["value"], event["source"]) for event in seen.of("option_applied")]
    assert applied == [(3, True, "--at"), (3, False, "recompute check")]
    assert "a block's recomputation saved other tensors than its forward" in seen.of("option_applied")[1]["detail"]
    assert [(event["step"], event["reason"][:34]) for event in seen.of("option_refused")] == [
        (5, "checkpointing failed at step 3: a ")]
    assert [row.options.checkpointing for row in seen.metrics] == [False] * 6
    assert [row.loss for row in seen.metrics] == [row.loss for row in seen_plain.metrics]
