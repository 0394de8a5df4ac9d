"""``torch.compile`` as a live option: how the model is compiled, when, and what a failure says.

The mode is torch.compile's default: inductor, with neither CUDA graphs ("reduce-overhead", which does
nothing on a CPU and on CUDA wants inputs at fixed addresses and no CPU work between kernels: the probes
and the per-step host transfer break it) nor kernel benchmarking ("max-autotune", minutes of tuning at the
first compile: too long for a key pressed while a run trains). The default is what PyTorch recommends to
start with, and the fastest to compile. ``fullgraph`` stays off: what Dynamo cannot trace runs eagerly
between compiled graphs (a graph break) instead of failing the whole model.

torch.compile is lazy: ``torch.compile(model)`` checks nothing, the forward compiles at the first call and
the backward at the first backward. A failure at either would surface in the middle of a training step. So
the trainer compiles at the step boundary, running one forward and backward of a batch through the compiled
model (``compile_on_batch``) with nothing of the run changed by it (random number generators and buffers put
back, gradients dropped): a failure there is a refusal with its reason (``failure_reason``), and training
goes on uncompiled. The compile time is reported with the acknowledgement; it is in no step's time.

A step that compiles again later (a guard that failed: another precision, checkpointing switched, a new
input shape) is counted by ``compiled_graphs`` and marked in its metrics record as compile time.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import torch

from torchlab.core.engine.state.checkpoint import capture_rng_state, restore_rng_state

#: torch's own advice, repeated in its messages: not what a user of this workbench can act on.
_TORCH_ADVICE = ("Set TORCHDYNAMO_VERBOSE", "For even more developer context", "Use tlparse", "While executing",
                 "Original traceback", "You can suppress this exception", "torch._dynamo.config")
#: A message that begins with the name of the error it is ("InvalidCxxCompiler: No working C++ compiler ...").
_NAMED_ERROR = re.compile(r"[A-Z][A-Za-z0-9_]*: ")
#: A reason shown in the event log and the journal stays a paragraph.
MAX_REASON_CHARS = 400


#: The ``dynamic`` option's values as torch.compile's ``dynamic`` argument: auto is torch's default (None: each size
#: specialised until a dimension changes, then that dimension dynamic), on is dynamic from the first compile, off a
#: graph specialised to each size.
DYNAMIC_ARGUMENT = {"auto": None, "on": True, "off": False}


def compile_model(module: torch.nn.Module, dynamic: str) -> torch.nn.Module:
    """The module compiled, in torch.compile's default mode with the ``dynamic`` option's shapes; nothing compiles
    until it is called.

    The wrapper only: ``module`` itself is unchanged, so its state dict keeps its keys (no ``_orig_mod.``
    prefix), which is what checkpoints save."""
    return torch.compile(module, dynamic=DYNAMIC_ARGUMENT[dynamic])


def forget_compiled() -> None:
    """Drop every graph torch.compile holds in this process. Its caches are by code object, whatever the wrapper:
    the graphs compiled under other shapes' settings would pass their guards and be run again, so a change of
    ``dynamic`` compiles afresh."""
    import torch._dynamo  # imported by the compile that made what is forgotten: nothing new

    torch._dynamo.reset()


def compiled_graphs() -> int:
    """Graphs torch.compile has compiled in this process so far: a step during which it grew compiled.

    Called only once something is compiled: importing torch._dynamo (and inductor with it) took 3 s at
    every trainer's start on this project's CI machine, for runs that never compile."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def compile_on_batch(model: torch.nn.Module, forward_and_backward: Callable[[], None]) -> float:
    """Run ``forward_and_backward`` (one micro-batch through the compiled model, then its backward) so that
    both compile now; return the seconds it took. Nothing of the run changes: the random number generators
    and ``model``'s buffers (BatchNorm statistics) are put back, the gradients set to None. Errors propagate,
    with all of that put back too."""
    rng = capture_rng_state()
    buffers = [(buffer, buffer.detach().clone()) for buffer in model.buffers()]
    started = time.perf_counter()
    try:
        forward_and_backward()
        return time.perf_counter() - started
    finally:
        with torch.no_grad():
            for buffer, saved in buffers:
                buffer.copy_(saved)
        for parameter in model.parameters():
            parameter.grad = None
        restore_rng_state(rng)


def failure_reason(error: BaseException) -> str:
    """Why the model did not compile, in a paragraph a user can act on: the error's own lines without
    torch's advice on its internal logs, and what to do where the cause is known."""
    lines = [line.strip() for line in str(error).splitlines()]
    kept = [line for line in lines if line and not line.startswith(_TORCH_ADVICE)]
    text = " ".join(kept) or type(error).__name__
    text = text.removeprefix("backend='inductor' raised: ")  # the error inductor raised, named as its first word
    if not _NAMED_ERROR.match(text):
        text = f"{type(error).__name__}: {text}"
    if len(text) > MAX_REASON_CHARS:
        text = text[: MAX_REASON_CHARS - 3] + "..."
    if "InvalidCxxCompiler" in text or "C++ compiler" in text:
        text += " (on a CPU inductor compiles C++: install a C++ compiler such as g++, or name one in CXX)"
    elif "double backward" in text:
        text += " (the model takes gradients inside its forward, e.g. a gradient penalty: train it uncompiled)"
    return text
