"""Tiny workloads for the engine's tests: one that trains in milliseconds, and ones that fail on purpose.

Each factory takes no arguments, as on the command line: ``tests/workloads/tiny.py:nan_in_forward``.
"""

from __future__ import annotations

import itertools
import os
import signal
import time

import torch
from torch import nn
from torch.utils.data import TensorDataset

from torchlab.core.workload import Workload


def _regression_data(samples: int = 256, features: int = 8, seed: int = 7) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(samples, features, generator=generator)
    teacher = torch.randn(features, 1, generator=generator)
    targets = torch.tanh(inputs @ teacher) + 0.05 * torch.randn(samples, 1, generator=generator)
    return TensorDataset(inputs, targets)


class TinyNet(nn.Module):
    """Linear stem, a Sequential of blocks (the checkpoint blocks), dropout, and a head."""

    def __init__(self, features: int = 8, width: int = 16, depth: int = 3, extra: nn.Module | None = None) -> None:
        super().__init__()
        self.stem = nn.Linear(features, width)
        self.body = nn.Sequential(
            *(nn.Sequential(nn.Linear(width, width), nn.ReLU(inplace=True), nn.Dropout(0.1)) for _ in range(depth))
        )
        self.extra = extra if extra is not None else nn.Identity()
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.extra(self.body(torch.relu(self.stem(x)))))


def mse_loss(model: nn.Module, batch) -> torch.Tensor:
    inputs, targets = batch
    return nn.functional.mse_loss(model(inputs), targets)


def workload() -> Workload:
    return Workload(
        model=TinyNet(),
        dataset=_regression_data(),
        val_dataset=_regression_data(64, seed=8),
        loss_fn=mse_loss,
        batch_size=16,
    )


class PoisonAfter(nn.Module):
    """Multiplies by NaN once it has run ``calls`` times (so a replay of the failing step fails too)."""

    def __init__(self, calls: int) -> None:
        super().__init__()
        self.calls_left = calls

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls_left -= 1
        return x * float("nan") if self.calls_left < 0 else x


def nan_in_forward() -> Workload:
    model = TinyNet(extra=PoisonAfter(calls=5))
    return Workload(model=model, dataset=_regression_data(), loss_fn=mse_loss, batch_size=16)


class _NanGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * float("nan")


class GradBomb(nn.Module):
    """Finite forward, NaN backward: the kind of bug (sqrt at 0, a bad custom op) the guard must name."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _NanGradient.apply(x)


def nan_in_backward() -> Workload:
    return Workload(model=TinyNet(extra=GradBomb()), dataset=_regression_data(), loss_fn=mse_loss, batch_size=16)


def shape_mismatch() -> Workload:
    """The model expects 8 features; the data has 5: the first step must name this file and line."""
    data = TensorDataset(torch.randn(64, 5), torch.randn(64, 1))
    return Workload(model=TinyNet(features=8), dataset=data, loss_fn=mse_loss, batch_size=16)


def loss_per_sample(model: nn.Module, batch) -> torch.Tensor:
    inputs, targets = batch
    return (model(inputs) - targets).square()  # forgot .mean()


def not_scalar() -> Workload:
    return Workload(model=TinyNet(), dataset=_regression_data(), loss_fn=loss_per_sample, batch_size=16)


class RaisesLater(nn.Module):
    def __init__(self, calls: int) -> None:
        super().__init__()
        self.calls_left = calls

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls_left -= 1
        if self.calls_left < 0:
            raise RuntimeError("simulated failure inside the model")
        return x


def raises_at_step_4() -> Workload:
    return Workload(model=TinyNet(extra=RaisesLater(calls=3)), dataset=_regression_data(), loss_fn=mse_loss, batch_size=16)


def factory_raises() -> Workload:
    raise ValueError("dataset path /data/missing not found")


def returns_list():
    return [TinyNet()]


def needs_arguments(width):
    return workload()


def no_checkpoint_blocks() -> Workload:
    return Workload(model=nn.Linear(8, 1), dataset=_regression_data(), loss_fn=mse_loss, batch_size=16)


def bad_checkpoint_block_name() -> Workload:
    return Workload(
        model=TinyNet(), dataset=_regression_data(), loss_fn=mse_loss, batch_size=16, checkpoint_blocks=["body.9"]
    )


def without_dropout() -> Workload:
    """No randomness in the step: data-parallel gradients must equal single-process ones exactly."""
    return Workload(model=_without_dropout(TinyNet()), dataset=_regression_data(), loss_fn=mse_loss, batch_size=16)


class FailsOnRank(nn.Module):
    """On rank ``rank`` (the launcher's RANK), at its ``calls``-th forward: raise, or kill its own process."""

    def __init__(self, rank: int, calls: int, how: str) -> None:
        super().__init__()
        self.armed = os.environ.get("RANK") == str(rank)
        self.calls_left, self.how = calls, how

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls_left -= 1
        if self.armed and self.calls_left < 0:
            if self.how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError("simulated failure on one rank")
        return x


def rank_1_raises_at_step_4() -> Workload:
    return Workload(model=TinyNet(extra=FailsOnRank(1, calls=3, how="raise")), dataset=_regression_data(), loss_fn=mse_loss, batch_size=16)


def rank_1_killed_at_step_4() -> Workload:
    return Workload(model=TinyNet(extra=FailsOnRank(1, calls=3, how="kill")), dataset=_regression_data(), loss_fn=mse_loss, batch_size=16)


class OutOfMemoryUnderAutocast(nn.Module):
    """Under CPU autocast (amp=bf16), on rank ``rank`` (the launcher's RANK; every process if None): an
    allocation the CPU allocator refuses, as a model too big for bf16's extra copies would meet."""

    def __init__(self, rank: int | None = None) -> None:
        super().__init__()
        self.armed = rank is None or os.environ.get("RANK") == str(rank)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.armed and torch.is_autocast_enabled("cpu"):
            torch.empty(2**50, dtype=torch.uint8)  # 1 PiB: "DefaultCPUAllocator: can't allocate memory"
        return x


def out_of_memory_under_bf16() -> Workload:
    return Workload(model=TinyNet(extra=OutOfMemoryUnderAutocast()), dataset=_regression_data(), loss_fn=mse_loss, batch_size=16)


def rank_1_out_of_memory_under_bf16() -> Workload:
    return Workload(model=TinyNet(extra=OutOfMemoryUnderAutocast(rank=1)), dataset=_regression_data(), loss_fn=mse_loss,
                    batch_size=16)


class _HookThatFailsOnItsThirdCall:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, module: nn.Module, inputs, output) -> None:
        self.calls += 1
        if self.calls == 3:
            raise ValueError("the user's forward hook failed on purpose")


def forward_hook_raises() -> Workload:
    """A model with the user's own forward hook, which raises in step 3: reported with its traceback."""
    built = workload()
    built.model.body[0].register_forward_hook(_HookThatFailsOnItsThirdCall())
    return built


def interrupts_itself() -> Workload:
    """``workload``, whose process gets a Ctrl-C (SIGINT; or ``$TORCHLAB_TEST_SIGNAL``, ``USR1`` say) in the forward of
    each optimizer step listed in ``$TORCHLAB_TEST_INTERRUPT_AT`` (``17``, or ``5,6`` for two) when that is set: a run
    interrupted at a known step. The hook holds no parameters and draws no random numbers, so the run trains exactly
    as ``workload`` does."""
    built = workload()
    interrupt_at = os.environ.get("TORCHLAB_TEST_INTERRUPT_AT")
    if interrupt_at is not None:
        calls = itertools.count(1)
        steps = {int(step) for step in interrupt_at.split(",")}

        def interrupt(module: nn.Module, inputs) -> None:
            if next(calls) in steps:
                os.kill(os.getpid(), signal.Signals["SIG" + os.environ.get("TORCHLAB_TEST_SIGNAL", "INT")])

        built.model.register_forward_pre_hook(interrupt)
    return built


def slow_to_load() -> Workload:
    """A factory that takes a minute (a large dataset being read): a trainer stopped meanwhile has nothing to save."""
    import time

    time.sleep(60)
    return workload()


class ResidualCNN(nn.Module):
    """Not one of the samples: a stem, three residual stages with BatchNorm, a head (for memory by kind)."""

    def __init__(self) -> None:
        super().__init__()
        from torchlab.sample_models.convnet import Stage  # two 3x3 conv + BatchNorm with a shortcut

        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.blocks = nn.Sequential(Stage(16, 16, 1), Stage(16, 32, 2), Stage(32, 32, 1))
        self.head = nn.Linear(32, 10)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(images)).mean(dim=(2, 3)))


def _classification_loss(model: nn.Module, batch) -> torch.Tensor:
    images, labels = batch
    return nn.functional.cross_entropy(model(images), labels)


def residual_cnn() -> Workload:
    generator = torch.Generator().manual_seed(3)
    data = TensorDataset(torch.randn(256, 3, 16, 16, generator=generator), torch.randint(10, (256,), generator=generator))
    return Workload(model=ResidualCNN(), dataset=data, batch_size=32, loss_fn=_classification_loss)


class GradientPenalty(nn.Module):
    """TinyNet plus a penalty on the gradient of its output with respect to its input, taken inside forward
    (``create_graph``, as a WGAN-GP critic does): it trains uncompiled; torch.compile cannot train it (its
    compiled backward cannot be differentiated again)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = TinyNet()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.detach().requires_grad_()
        y = self.net(x)
        (slope,) = torch.autograd.grad(y.sum(), x, create_graph=True)
        return y + 0.01 * slope.square().sum(dim=1, keepdim=True)


def gradient_penalty() -> Workload:
    return Workload(model=GradientPenalty(), dataset=_regression_data(), loss_fn=mse_loss, batch_size=16)


class OutOfMemoryAbove(nn.Module):
    """A forward of more than ``samples`` samples raises CUDA's out-of-memory error, as a model too big for its
    batch on a GPU does (the CPU tests' stand-in for a real allocation over the card)."""

    def __init__(self, samples: int) -> None:
        super().__init__()
        self.samples = samples

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > self.samples:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate 2.00 GiB for {x.shape[0]} samples")
        return x


def _without_dropout(model: nn.Module) -> nn.Module:
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    return model


def out_of_memory_above_8() -> Workload:
    """Batches of 16; a forward of more than 8 samples runs out of memory."""
    return Workload(model=_without_dropout(TinyNet(extra=OutOfMemoryAbove(8))), dataset=_regression_data(),
                    loss_fn=mse_loss, batch_size=16)


def out_of_memory_above_8_after_dropout() -> Workload:
    """``out_of_memory_above_8`` with its dropout: the failed forward draws masks before it runs out of memory."""
    return Workload(model=TinyNet(extra=OutOfMemoryAbove(8)), dataset=_regression_data(), loss_fn=mse_loss, batch_size=16)


def dropout_within_memory() -> Workload:
    """``out_of_memory_above_8_after_dropout`` with room for its batch: the run it is compared with."""
    return Workload(model=TinyNet(extra=OutOfMemoryAbove(16)), dataset=_regression_data(), loss_fn=mse_loss, batch_size=16)


def out_of_memory_always() -> Workload:
    """Every forward runs out of memory, however small its batch."""
    return Workload(model=_without_dropout(TinyNet(extra=OutOfMemoryAbove(0))), dataset=_regression_data(),
                    loss_fn=mse_loss, batch_size=16)


def out_of_memory_above_8_with_batch_norm() -> Workload:
    """As ``out_of_memory_above_8``, with a BatchNorm layer: what a split changes besides memory."""
    extra = nn.Sequential(nn.BatchNorm1d(16), OutOfMemoryAbove(8))
    return Workload(model=_without_dropout(TinyNet(extra=extra)), dataset=_regression_data(), loss_fn=mse_loss,
                    batch_size=16)


class ScalesBatchAt(nn.Module):
    """Multiplies its input by ``factor`` on the forwards in training mode numbered in ``calls`` (a bad batch at
    those steps, where a step is one forward): what the spike guard holds back."""

    def __init__(self, calls: tuple[int, ...], factor: float) -> None:
        super().__init__()
        self.calls, self.scaled, self.factor = 0, calls, factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return x
        self.calls += 1
        return x * self.factor if self.calls in self.scaled else x


def _sgd_regression(*scaled_calls: int) -> Workload:
    model = _without_dropout(TinyNet())
    model.stem = nn.Sequential(ScalesBatchAt(scaled_calls, 1e4), model.stem)
    return Workload(model=model, dataset=_regression_data(), loss_fn=mse_loss, batch_size=16,
                    optimizer=lambda model: torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))


def spike_at_step_21() -> Workload:
    """SGD on the regression; step 21's batch scaled by 1e4 (its loss ~1e8): without the guard, non-finite within
    a few steps."""
    return _sgd_regression(21)


def spikes_at_steps_21_and_31() -> Workload:
    return _sgd_regression(21, 31)


def sgd_without_spike() -> Workload:
    """``spike_at_step_21`` without the bad batch: the clean run it is compared with."""
    return _sgd_regression()


class _KeptForBackward(torch.autograd.Function):
    """``x`` as it is, with ``held`` saved for backward: memory a step holds until its backward, as activations."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, held: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(held)
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


class AllocatesPerSample(nn.Module):
    """Allocates a twenty-fourth of the GPU's memory for each sample of its input, kept for backward, then as much
    again: real CUDA allocations that fail above 12 samples. At 16 the second fails (1.33 times the card) while
    the first (two thirds of it) is held by the failed step's graph; a retry at 8 fits (two thirds) only where the
    rescue freed what the failed attempt held."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        share = torch.cuda.get_device_properties(x.device).total_memory // 24
        first = torch.zeros(x.shape[0] * share, dtype=torch.uint8, device=x.device)
        x = _KeptForBackward.apply(x, first)
        second = torch.zeros(x.shape[0] * share, dtype=torch.uint8, device=x.device)
        return _KeptForBackward.apply(x, second)


def cuda_out_of_memory_above_8() -> Workload:
    """Batches of 16 that a GPU cannot hold in one forward, and can in two of 8."""
    return Workload(model=_without_dropout(TinyNet(extra=AllocatesPerSample())), dataset=_regression_data(),
                    loss_fn=mse_loss, batch_size=16)


class OutOfMemoryOnRank1From5th(nn.Module):
    """On rank 1, from its 5th forward in this process on, a forward of more than 4 samples runs out of memory."""

    def __init__(self) -> None:
        super().__init__()
        self.calls, self.armed = 0, os.environ.get("RANK") == "1"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += self.training
        if self.armed and self.calls >= 5 and x.shape[0] > 4:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate 2.00 GiB for {x.shape[0]} samples")
        return x


def rank_1_out_of_memory_above_4_from_step_5() -> Workload:
    """Batches of 16, 8 a rank at world size 2: rank 1's step 5 runs out of memory; 4 samples a piece fit."""
    return Workload(model=_without_dropout(TinyNet(extra=OutOfMemoryOnRank1From5th())), dataset=_regression_data(),
                    loss_fn=mse_loss, batch_size=16)


class Pair:
    """A batch of the user's own type: the engine finds no tensor in it to count or split (a CPU run needs no move)."""

    def __init__(self, samples: list) -> None:
        self.inputs = torch.stack([inputs for inputs, _ in samples])
        self.targets = torch.stack([targets for _, targets in samples])


def out_of_memory_until_two_blocks_are_checkpointed_with_batches_of_its_own_type() -> Workload:
    """``out_of_memory_until_two_blocks_are_checkpointed`` whose batches cannot be split: the rescue goes to checkpointing."""
    return Workload(model=BlocksOfWidths(), dataset=_regression_data(), collate_fn=Pair, batch_size=4,
                    loss_fn=lambda model, batch: nn.functional.mse_loss(model(batch.inputs), batch.targets))


class _Jittered(torch.utils.data.Dataset):
    """``_regression_data`` with noise drawn in ``__getitem__`` from the process's generators (torch's, Python's,
    NumPy's), as augmentations draw: which batch is drawn when decides the numbers."""

    def __init__(self) -> None:
        self.data = _regression_data()

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int):
        import random

        import numpy

        inputs, targets = self.data[index]
        jitter = 0.1 * torch.randn(inputs.shape) + 0.01 * random.random() + 0.01 * float(numpy.random.rand())
        return inputs + jitter, targets


def jittered_data() -> Workload:
    return Workload(model=TinyNet(), dataset=_Jittered(), loss_fn=mse_loss, batch_size=16)


class BlocksOfWidths(nn.Module):
    """Four blocks that save different amounts for backward (inner widths 16, 128, 32, 64: blocks.1 the most, then
    blocks.3); from its third forward in training on, one with fewer than two of them checkpointed runs out of
    memory, as a model that fits its card only with its largest savers checkpointed does (a CPU stand-in)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(nn.Sequential(nn.Linear(8, width), nn.Tanh(), nn.Linear(width, 8))
                                      for width in (16, 128, 32, 64)))
        self.head = nn.Linear(8, 1)
        self.forwards = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.forwards += 1
            checkpointed = sum("forward" in vars(block) for block in self.blocks)  # what activation checkpointing wraps
            if self.forwards > 2 and checkpointed < 2:
                raise torch.OutOfMemoryError(f"CUDA out of memory with {checkpointed} blocks checkpointed")
        return self.head(self.blocks(x))


def out_of_memory_until_two_blocks_are_checkpointed() -> Workload:
    return Workload(model=BlocksOfWidths(), dataset=_regression_data(), loss_fn=mse_loss, batch_size=4)


class KillsRank1(nn.Module):
    """On rank 1, where ``TINY_KILL_RANK_1_AT`` says N, SIGKILL at its N-th training forward (a micro-batch's;
    evaluation's do not count): a crash that a resume, without the variable, trains past."""

    def __init__(self) -> None:
        super().__init__()
        at = os.environ.get("TINY_KILL_RANK_1_AT") if os.environ.get("RANK") == "1" else None
        self.forwards_left = int(at) if at else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and self.forwards_left is not None:
            self.forwards_left -= 1
            if self.forwards_left == 0:
                os.kill(os.getpid(), signal.SIGKILL)
        return x


def rank_1_killed_where_asked() -> Workload:
    """``workload``, its rank 1 killed at the forward ``TINY_KILL_RANK_1_AT`` names (KillsRank1 has no parameters), and
    built with other weights on rank 1, as a model whose initialisation is not seeded would be: every rank must
    start from rank 0's (DDP broadcasts them; a sharded model must too, before it is sharded)."""
    built = workload()
    built.model.extra = KillsRank1()
    if os.environ.get("RANK") == "1":
        with torch.no_grad():
            for parameter in built.model.parameters():
                parameter.add_(0.5)
    return built


class _PaddedTokens(torch.utils.data.Dataset):
    """Sequences of 6 tokens of which only the first count (the rest padding): one of all 6, the others' first only,
    so no two halves of a batch of 8 hold as many tokens each (13 in all), whatever the order."""

    def __init__(self, samples: int = 8) -> None:
        generator = torch.Generator().manual_seed(3)
        self.x = torch.randn(samples, 6, 4, generator=generator)
        self.y = torch.randn(samples, 6, generator=generator)
        counts = torch.ones(samples, dtype=torch.long)
        counts[-1] = 6
        self.mask = (torch.arange(6)[None, :] < counts[:, None]).float()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> dict:
        return {"x": self.x[index], "y": self.y[index], "mask": self.mask[index]}


def masked_token_mse(model: nn.Module, batch) -> torch.Tensor:
    errors = (model(batch["x"]).squeeze(-1) - batch["y"]) ** 2
    return (errors * batch["mask"]).sum() / batch["mask"].sum()


def token_mean() -> Workload:
    """A loss that is a mean over the tokens that count, with the items it averages over (Workload.loss_items)."""
    return Workload(model=nn.Linear(4, 1), dataset=_PaddedTokens(), loss_fn=masked_token_mse,
                    loss_items=lambda batch: batch["mask"].sum(), batch_size=4)


class _CountsItsCalls(nn.Module):
    """A block whose forward depends on a state it changes: every other call first adds 0 x sigmoid of the batch's
    sum, the same values and gradients, but another tensor saved for backward, so its recomputation under
    checkpointing saves other tensors than its forward did (torch's CheckpointError)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls % 2 == 0:
            x = x + 0 * torch.sigmoid(x.sum(0, keepdim=True))
        return torch.relu(self.linear(x))


def recomputes_otherwise() -> Workload:
    model = nn.Sequential(_CountsItsCalls(), _CountsItsCalls(), nn.Linear(8, 1))
    return Workload(model=model, dataset=_regression_data(), loss_fn=mse_loss)


def reads_its_loss() -> Workload:
    """A loss_fn that reads its loss's value in Python (a check many training scripts make): a step that runs on
    data only, which the memory forecast's fake tensors cannot run."""

    def checked_mse(model: nn.Module, batch) -> torch.Tensor:
        loss = mse_loss(model, batch)
        if loss.item() > 1e6:
            raise RuntimeError("the loss diverged")
        return loss

    return Workload(model=TinyNet(), dataset=_regression_data(), loss_fn=checked_mse, batch_size=16)


class _Sentences(torch.utils.data.Dataset):
    """Token sequences whose length grows with the index (the first samples the shortest: 4 tokens, the last 64),
    each with a label: a text dataset padded per batch, where each batch is as long as its longest sequence."""

    def __init__(self, samples: int = 128, vocab: int = 50) -> None:
        generator = torch.Generator().manual_seed(5)
        self.sequences = [torch.randint(1, vocab, (4 + 60 * index // (samples - 1),), generator=generator)
                          for index in range(samples)]
        self.labels = torch.randint(2, (samples,), generator=generator)

    def __len__(self) -> int:
        return len(self.sequences)

    def __getitem__(self, index: int):
        return self.sequences[index], self.labels[index]


def _padded(samples):
    sequences, labels = zip(*samples)
    return {"tokens": torch.nn.utils.rnn.pad_sequence(list(sequences), batch_first=True), "labels": torch.stack(labels)}


class _Tagger(nn.Module):
    """Each token embedded and passed through an MLP, then pooled: activations in proportion to the tokens."""

    def __init__(self, vocab: int = 50, width: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width, padding_idx=0)
        self.body = nn.Sequential(nn.Sequential(nn.Linear(width, 4 * width), nn.GELU()),
                                  nn.Sequential(nn.Linear(4 * width, width), nn.GELU()))
        self.head = nn.Linear(width, 2)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.embed(tokens)).mean(dim=1))


def _tagging_loss(model: nn.Module, batch) -> torch.Tensor:
    return nn.functional.cross_entropy(model(batch["tokens"]), batch["labels"])


def varying_lengths() -> Workload:
    """Batches of varying length: the dataset's first samples are its shortest, so a batch of them is no measure of the
    memory a step takes (the memory forecast's longest batch)."""
    return Workload(model=_Tagger(), dataset=_Sentences(), collate_fn=_padded, loss_fn=_tagging_loss, batch_size=8,
                    checkpoint_blocks=["body.0", "body.1"])


def _collate_slowly(samples):
    """The default collate, after 20 ms: a loader that reads each batch from a slow disk."""
    time.sleep(0.020)
    return torch.utils.data.default_collate(samples)


class _SleepingBackward(torch.autograd.Function):
    """The identity, whose backward takes 15 ms: a known share of a step's backward."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        time.sleep(0.015)
        return grad


class _SlowBothWays(nn.Module):
    """10 ms more in forward, 15 ms more in backward: each phase of a step that runs it is known."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.010)
        return _SleepingBackward.apply(x)


def slow_loader() -> Workload:
    """Each batch takes its loader 20 ms, each forward 10 ms and each backward 15 ms: an input-bound step. An epoch of
    128 batches: a loader's workers start again at each (their start is the data phase's too)."""
    return Workload(model=TinyNet(extra=_SlowBothWays()), dataset=_regression_data(2048), loss_fn=mse_loss, batch_size=16,
                    collate_fn=_collate_slowly)


class _NarrowBlock(nn.Module):
    """A LayerNorm, a Linear 8→8 and a gated GELU with a residual: a dozen small elementwise ops, each an op's own
    cost on the host and next to nothing on the device; torch.compile fuses them into a few."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear(self.norm(x))
        return x + nn.functional.gelu(h) * torch.sigmoid(h) * 0.5


def many_small_ops(depth: int = 8) -> Workload:
    """A deep, narrow model whose step is hundreds of tiny ops (launch-bound: the host's cost of each is the step's
    time), which compiling makes faster, unlike TinyNet's 140, whose compiled graphs' own calls cost more than they
    save on a CPU."""
    model = nn.Sequential(*[_NarrowBlock(8) for _ in range(depth)], nn.Linear(8, 1))
    return Workload(model=model, dataset=_regression_data(512), loss_fn=mse_loss, batch_size=16)


class _Breaking(nn.Module):
    """TinyNet's stem and head with a data-dependent branch and a print between: two graph breaks under compile."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.head = nn.Linear(8, 16), nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.stem(x))
        if h.mean() > 0.5:  # BREAK: data-dependent branching
            h = h * 0.5
        print(end="")  # BREAK: a builtin Dynamo cannot trace
        return self.head(h)


def graph_breaks() -> Workload:
    """A model whose forward breaks torch.compile's graph twice (the lines marked BREAK)."""
    return Workload(model=_Breaking(), dataset=_regression_data(), loss_fn=mse_loss, batch_size=16)


class _ThreeLengths(torch.utils.data.Dataset):
    """Token sequences of three lengths, 8, 12 and 16. A batch is padded to its longest sample, and the sampler shuffles:
    three in four samples are of 8, one in six of 12, so that a batch of four is of each length about as often."""

    def __init__(self, samples: int = 96, vocab: int = 50) -> None:
        generator = torch.Generator().manual_seed(6)
        lengths = [16 if index % 32 < 3 else 12 if index % 32 < 8 else 8 for index in range(samples)]
        self.sequences = [torch.randint(1, vocab, (length,), generator=generator) for length in lengths]
        self.labels = torch.randint(2, (samples,), generator=generator)

    def __len__(self) -> int:
        return len(self.sequences)

    def __getitem__(self, index: int):
        return self.sequences[index], self.labels[index]


def three_lengths() -> Workload:
    """Batches of three sequence lengths, mixed: torch.compile recompiles for a second length (and, its shapes static,
    a third)."""
    return Workload(model=_Tagger(), dataset=_ThreeLengths(), collate_fn=_padded, loss_fn=_tagging_loss, batch_size=4)


def _slow_on_rank_1(samples: list) -> tuple[torch.Tensor, ...]:
    """PyTorch's default collate, after 15 ms of waiting where this process is rank 1: one rank's slow data path."""
    if os.environ.get("RANK") == "1":
        time.sleep(0.015)
    return torch.utils.data.default_collate(samples)


def slow_data_on_rank_1() -> Workload:
    """``workload`` whose batches take rank 1 15 ms longer to load (its collate waits): with ranks, a straggler whose
    every step the others wait for at the gradients' sync; without, the same run as ``workload``."""
    built = workload()
    built.collate_fn = _slow_on_rank_1
    return built


def hangs_on_rank_1() -> Workload:
    """``workload`` whose rank 1 stops in its 12th forward for an hour (the line marked ``# HANG``), as a rank stuck
    in a filesystem or a driver would: every other rank then waits for it at the gradients' sync."""
    built = workload()
    calls = itertools.count(1)

    def stop_on_rank_1(module: nn.Module, inputs) -> None:
        if next(calls) == 12 and os.environ.get("RANK") == "1":
            time.sleep(3600)  # HANG

    built.model.register_forward_pre_hook(stop_on_rank_1)
    return built
