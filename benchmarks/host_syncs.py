"""Host synchronisations per training step on a GPU, per option, and what one a step costs (issue 17).

1. **Syncs per step.** The engine trains a few warm-up steps, then ``torch.cuda.set_sync_debug_mode("warn")``
   turns every operation that makes the host wait for the GPU (``.item()``, a copy to unpinned host memory,
   ``nonzero``, a GradScaler's check for infs, ...) into a warning, which is counted per step and by the
   line of Python that asked for it. Once per option setting: off, bf16, fp16 and clip. The engine's own
   promise is one transfer a step (the step report); anything more is named here by its line.
2. **What one sync a step costs.** A plain loop that reads its loss every step (``loss.item()``, as every
   loop that prints a loss does) against the same loop adding its losses up on the device and reading them
   once a block, interleaved in blocks in one process. The difference is the price of the engine's one
   sync a step: if it is over 1 % on a model, the step report should be read a step late (pinned buffer
   and an event), keeping the non-finite guard's promise. A third loop reads every step but fetches the next
   batch (and queues its copy) before the read: how much of the sync's price is the host's data work that
   otherwise follows it, which the engine could move without reading anything late.

    python benchmarks/host_syncs.py --device cuda --json syncs_tiny_gpt.json
    python benchmarks/host_syncs.py --device cuda --workload gpt100m --json syncs_gpt100m.json

On a CPU the sync debug mode sees nothing (there is no device to wait for): the counts are zero by
construction and the timing compares two loops that differ by nothing; ``gpu_pass.sh`` runs it there
only to check the script itself.
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import random
import statistics
import time
import warnings
from pathlib import Path

import torch

import gpt100m
from probe_overhead import BareLoop, make_engine
from torchlab.core.engine.adapters.loading import load_workload
from torchlab.core.engine.seeding import seed_everything
from torchlab.core.engine.trainer import Trainer

#: the option settings counted, each against the engine's defaults
SETTINGS = {"off": {}, "bf16": {"amp": "bf16"}, "fp16": {"amp": "fp16"}, "clip": {"clip": 1.0}}
SYNC_WARNING = "synchroniz"  # "called a synchronizing CUDA operation"


def where(warning: warnings.WarningMessage) -> str:
    """The line that asked for the sync, shortened to the package's own path."""
    path = str(warning.filename)
    for marker in ("site-packages/", "torchlab/", "benchmarks/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{path}:{warning.lineno}"


def count_syncs(trainer: Trainer, steps: int) -> tuple[list[int], collections.Counter]:
    """Syncs in each of ``steps`` steps, and how many each line of Python asked for."""
    per_step: list[int] = []
    by_line: collections.Counter = collections.Counter()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        for _ in range(steps):
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                trainer.train_steps(1)
            syncs = [w for w in seen if SYNC_WARNING in str(w.message)]
            per_step.append(len(syncs))
            by_line.update(where(w) for w in syncs)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    return per_step, by_line


def time_one_sync_a_step(template, batch_size: int, device: torch.device, rounds: int, block: int) -> dict:
    """Interleaved blocks: the plain loop with ``loss.item()`` every step against the same loop without."""
    runners = {
        "reads every step": BareLoop(copy.deepcopy(template), batch_size, 1e-3, device=device),
        "reads once a block": BareLoop(copy.deepcopy(template), batch_size, 1e-3, device=device,
                                       reads_loss_every_step=False),
        "reads every step, fetched first": BareLoop(copy.deepcopy(template), batch_size, 1e-3, device=device,
                                                    fetches_before_reading=True),
    }
    for runner in runners.values():
        runner.train_steps(3)
    times: dict[str, list[float]] = {name: [] for name in runners}
    order = list(runners)
    for _ in range(rounds):
        random.shuffle(order)
        for name in order:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            started = time.perf_counter()
            runners[name].train_steps(block)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times[name].append(time.perf_counter() - started)
    every, once = times["reads every step"], times["reads once a block"]
    ratios = sorted(o / e for e, o in zip(every, once))  # throughput with a sync a step, against without
    fetched_first = times["reads every step, fetched first"]
    prefetch_ratios = sorted(o / f for f, o in zip(fetched_first, once))
    return {
        "ms_per_step_reading_every_step_fetched_first": 1000 * statistics.median(fetched_first) / block,
        "throughput_with_one_sync_a_step_fetched_first": statistics.median(prefetch_ratios),
        "iqr_fetched_first": [prefetch_ratios[len(prefetch_ratios) // 4], prefetch_ratios[(3 * len(prefetch_ratios)) // 4]],
        "ms_per_step_reading_every_step": 1000 * statistics.median(every) / block,
        "ms_per_step_reading_once_a_block": 1000 * statistics.median(once) / block,
        "throughput_with_one_sync_a_step": statistics.median(ratios),
        "iqr": [ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4]],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="tiny_gpt", help="a sample, gpt100m, or path.py:factory")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=20, help="steps counted per option setting")
    parser.add_argument("--rounds", type=int, default=20, help="interleaved rounds of the timing")
    parser.add_argument("--steps-per-block", type=int, default=10)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    spec = gpt100m.SPEC if args.workload == "gpt100m" else args.workload
    device = torch.device(args.device)
    on_cuda = device.type == "cuda"

    seed_everything(0)
    template = load_workload(spec)
    batch_size = template.batch_size or 32
    gpu = torch.cuda.get_device_name(device) if on_cuda else f"no GPU ({torch.get_num_threads()} CPU threads)"
    print(f"{args.workload}: {sum(p.numel() for p in template.model.parameters()):,} parameters, batch {batch_size}, "
          f"torch {torch.__version__}, {gpu}")
    if not on_cuda:
        print("On a CPU the sync debug mode sees nothing: the counts below are zero by construction.")

    figures: dict = {"workload": args.workload, "device": gpu, "torch": torch.__version__, "settings": {}}
    print(f"\n{'setting':<8} {'syncs a step (each of ' + str(args.steps) + ')':<44} lines that asked")
    for name, options in SETTINGS.items():
        if name == "fp16" and not on_cuda:
            print(f"{name:<8} not counted: fp16 needs CUDA")
            continue
        trainer = make_engine(copy.deepcopy(template), spec, batch_size, 1e-3, "auto", args.device, options)
        trainer.train_steps(5)  # warm-up: the allocator, cuDNN/cuBLAS handles, the probe's cadence
        per_step, by_line = count_syncs(trainer, args.steps) if on_cuda else ([0] * args.steps, collections.Counter())
        figures["settings"][name] = {"per_step": per_step, "by_line": dict(by_line.most_common())}
        lines = ", ".join(f"{line} ×{count}" for line, count in by_line.most_common(4)) or "-"
        print(f"{name:<8} {' '.join(map(str, per_step)):<44} {lines}")
        del trainer

    timing = time_one_sync_a_step(template, batch_size, device, args.rounds, args.steps_per_block)
    figures["one_sync_a_step"] = timing
    cost = 1 - timing["throughput_with_one_sync_a_step"]
    print(f"\nA plain loop reading its loss every step: {timing['ms_per_step_reading_every_step']:.2f} ms/step; "
          f"reading it once a block: {timing['ms_per_step_reading_once_a_block']:.2f} ms/step.")
    print(f"One sync a step costs {100 * cost:.2f} % of throughput (median of {args.rounds} rounds, "
          f"IQR of the ratio {timing['iqr'][0]:.3f}-{timing['iqr'][1]:.3f}); the threshold for an asynchronous "
          f"step report is 1 %: {'over' if cost > 0.01 else 'not over'}.")
    print(f"With the next batch fetched before the read: {timing['ms_per_step_reading_every_step_fetched_first']:.2f} "
          f"ms/step, the sync then costs {100 * (1 - timing['throughput_with_one_sync_a_step_fetched_first']):.2f} % "
          f"(IQR of the ratio {timing['iqr_fetched_first'][0]:.3f}-{timing['iqr_fetched_first'][1]:.3f}).")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
