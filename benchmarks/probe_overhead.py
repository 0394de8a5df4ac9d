"""What do torchlab's probes cost? A bare PyTorch loop against the engine, interleaved in one process.

Variants, each with its own copy of the same model (same initial weights) and the same data:

  bare           a plain loop: DataLoader, AdamW, forward, backward, step, loss.item()
  engine-off     the torchlab Trainer with the gradient-norm probe off
  engine-taken   on CUDA: engine-off fetching each batch when it takes it, after the step's synchronisation, not
                 ahead of it (``BatchStream.fetch_ahead``): what fetching ahead is worth
  engine-every   the Trainer with per-module grad norms on every step   <- the goal: >= 0.98 of bare
  engine-auto    the Trainer with the self-timing cadence (default)
  naive-hooks    the bare loop plus the common naive pattern: a full backward hook per module that
                 calls .item() on a gradient norm (one host sync per module per step)

The variants run in blocks of K steps, in a shuffled order each round, so drift in the machine's speed
(thermal, other load) hits every variant alike. The figure is the median over rounds of the
per-round throughput ratio to the bare loop (bare time / variant time), with its interquartile range.

    python benchmarks/probe_overhead.py                     # tiny_gpt, the default sample
    python benchmarks/probe_overhead.py --workload mlp --rounds 12
    python benchmarks/probe_overhead.py --device cuda --json probe.json   # on a GPU (benchmarks/gpu_pass.sh)

On CUDA each block is timed between two synchronizations, so it counts the kernels and not only their
launches, and the bare loop pins its batches as the engine's loader does there.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import statistics
import time
import warnings
from pathlib import Path

import torch
from torch.utils._pytree import tree_map

from torchlab.core.engine.adapters.loading import load_workload
from torchlab.core.engine.seeding import seed_everything
from torchlab.core.engine.trainer import Trainer
from torchlab.core.records.config import build_config


class BareLoop:
    """The loop every PyTorch user writes; the baseline."""

    def __init__(self, workload, batch_size: int, lr: float, naive_hooks: bool = False,
                 device: torch.device = torch.device("cpu"), reads_loss_every_step: bool = True,
                 fetches_before_reading: bool = False) -> None:
        """``reads_loss_every_step=False``: the losses are added up on the device and read once a block
        (``host_syncs.py`` times what the one read a step costs on a GPU). ``fetches_before_reading``: the next
        step's batch is fetched and its copy queued before the loss is read, so the host's data work overlaps
        the GPU's instead of following the sync."""
        self.device = device
        self.reads_loss_every_step = reads_loss_every_step
        self.fetches_before_reading = fetches_before_reading
        self._fetched = None
        self.loss_sum = torch.zeros((), device=device)
        self.model = workload.model.to(device)
        self.loss_fn = workload.loss_fn
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr)
        generator = torch.Generator().manual_seed(0)
        # Pinned on CUDA, as the engine's loader is there by default (its pin_memory option).
        self.loader = torch.utils.data.DataLoader(
            workload.dataset, batch_size=batch_size, shuffle=True, drop_last=True, generator=generator,
            pin_memory=device.type == "cuda",
        )
        self.batches = iter(self.loader)
        self.norms: dict[str, float] = {}
        if naive_hooks:
            # The first module (an embedding) takes integer tokens; PyTorch warns that its hook sees outputs only.
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            for name, module in self.model.named_modules():
                if any(True for _ in module.parameters(recurse=False)):
                    module.register_full_backward_hook(self._naive_hook(name))

    def _naive_hook(self, name: str):
        def hook(module, grad_input, grad_output):
            if grad_output and grad_output[0] is not None:
                self.norms[name] = grad_output[0].norm().item()  # a host sync per module per step

        return hook

    def _next_batch(self):
        try:
            batch = next(self.batches)
        except StopIteration:
            self.batches = iter(self.loader)
            batch = next(self.batches)
        return tree_map(lambda value: value.to(self.device, non_blocking=True) if isinstance(value, torch.Tensor) else value, batch)

    def train_steps(self, count: int) -> None:
        for _ in range(count):
            batch = self._fetched if self._fetched is not None else self._next_batch()
            self._fetched = None
            loss = self.loss_fn(self.model, batch)
            loss.backward()
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            if self.fetches_before_reading:
                self._fetched = self._next_batch()
            if self.reads_loss_every_step:
                loss.item()  # what every training loop does to print its loss: a host sync on a GPU
            else:
                self.loss_sum += loss.detach()
        if not self.reads_loss_every_step:
            self.loss_sum.item()


def make_engine(workload, spec: str, batch_size: int, lr: float, probe_every, device: str = "cpu",
                options: dict | None = None) -> Trainer:
    """The engine as a run builds it, less the run directory and its observers; ``options``: live options at start."""
    config = build_config({}, {
        "workload": spec, "steps": 10**9, "batch_size": batch_size, "lr": lr, "schedule": "constant", "device": device,
        "eval_every": 0, "checkpoint_every": 0, "probe_every": probe_every, "options": options or {}, "at": [],
    })
    return Trainer(config, workload, observers=[])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="tiny_gpt")
    parser.add_argument("--batch-size", type=int, default=None, help="default: the workload's own")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps-per-block", type=int, default=10)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N: every variant trains there")
    parser.add_argument("--json", type=Path, help="also write the figures here (the GPU pass collects them)")
    args = parser.parse_args()
    device = torch.device(args.device)

    seed_everything(0)
    template = load_workload(args.workload)
    batch_size = args.batch_size or template.batch_size or 32

    def fresh():
        return copy.deepcopy(template)

    runners = {
        "bare": BareLoop(fresh(), batch_size, args.lr, device=device),
        "engine-off": make_engine(fresh(), args.workload, batch_size, args.lr, 0, args.device),
        "engine-every": make_engine(fresh(), args.workload, batch_size, args.lr, 1, args.device),
        "engine-auto": make_engine(fresh(), args.workload, batch_size, args.lr, "auto", args.device),
        "naive-hooks": BareLoop(fresh(), batch_size, args.lr, naive_hooks=True, device=device),
    }
    # The engine at the default cadence with no step timed by phase and no FLOP counted: what those cost, side by side
    # (on CUDA the stream's events: core/engine/measure/step_phases.py).
    runners["engine-untimed"] = make_engine(fresh(), args.workload, batch_size, args.lr, "auto", args.device)
    runners["engine-untimed"].instruments.phase_totals = runners["engine-untimed"].instruments.step_flops = None
    if device.type == "cuda":
        runners["engine-taken"] = make_engine(fresh(), args.workload, batch_size, args.lr, 0, args.device)
        runners["engine-taken"].data.fetches_ahead = False
    params = sum(p.numel() for p in template.model.parameters())
    modules = len(runners["engine-every"].instruments.grad_probe.module_names)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{torch.get_num_threads()} CPU threads"
    print(f"workload {args.workload}: {params:,} parameters in {modules} parameter-owning modules, "
          f"batch {batch_size}, torch {torch.__version__}, {where}")

    def synchronize() -> None:
        if device.type == "cuda":  # a block's time is its kernels' too, not only their launches
            torch.cuda.synchronize(device)

    for runner in runners.values():  # warm-up: allocator, autograd caches, first DataLoader epoch
        runner.train_steps(3)

    block_times: dict[str, list[float]] = {name: [] for name in runners}
    order = list(runners)
    for _ in range(args.rounds):
        random.shuffle(order)
        for name in order:
            synchronize()
            started = time.perf_counter()
            runners[name].train_steps(args.steps_per_block)
            synchronize()
            block_times[name].append(time.perf_counter() - started)

    bare = block_times["bare"]
    figures: dict[str, dict[str, float]] = {}
    print(f"\n{'variant':<14} {'ms/step':>9} {'throughput vs bare':>19} {'IQR':>15}")
    for name, times in block_times.items():
        ratios = [b / t for b, t in zip(bare, times)]
        quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
        figures[name] = {"ms_per_step": 1000 * statistics.median(times) / args.steps_per_block,
                         "vs_bare": statistics.median(ratios), "iqr_low": quartiles[0], "iqr_high": quartiles[2]}
        print(f"{name:<14} {figures[name]['ms_per_step']:>9.1f} "
              f"{statistics.median(ratios):>19.3f} {f'{quartiles[0]:.3f}–{quartiles[2]:.3f}':>15}")
    if "engine-taken" in block_times:  # side by side in each round: what fetching ahead saves the engine
        ahead = [taken / off for taken, off in zip(block_times["engine-taken"], block_times["engine-off"])]
        quartiles = statistics.quantiles(ahead, n=4) if len(ahead) > 1 else [ahead[0]] * 3
        figures["fetch_ahead_speedup"] = {"median": statistics.median(ahead), "iqr_low": quartiles[0],
                                          "iqr_high": quartiles[2]}
        print(f"\nFetching ahead: engine-off {statistics.median(ahead):.4f}x as fast as engine-taken "
              f"(IQR {quartiles[0]:.4f}-{quartiles[2]:.4f}, per round)")
    timed = [untimed / auto for untimed, auto in zip(block_times["engine-untimed"], block_times["engine-auto"])]
    quartiles = statistics.quantiles(timed, n=4) if len(timed) > 1 else [timed[0]] * 3
    totals = runners["engine-auto"].instruments.phase_totals
    figures["phases_cost"] = {"median": statistics.median(timed), "iqr_low": quartiles[0], "iqr_high": quartiles[2],
                              "events_share": totals.marks.cost_s / totals.trained_s if totals.marks.stream else None}
    print(f"\nTiming the phases and counting FLOPs: engine-untimed takes {statistics.median(timed):.4f} of engine-auto's time "
          f"(IQR {quartiles[0]:.4f}-{quartiles[2]:.4f}, per round)"
          + (f"; the stream's events took {100 * figures['phases_cost']['events_share']:.2f} % of training's time"
             if totals.marks.stream else ""))
    auto, every = runners["engine-auto"], runners["engine-every"]
    probe_ms = 1000 * every.instruments.cadence.probe_cost_s
    step_ms = 1000 * statistics.median(block_times["engine-every"]) / args.steps_per_block
    print(f"\nThe probe's own timing (foreach norms + per-module sums, on the training thread): "
          f"{probe_ms:.2f} ms per step = {100 * probe_ms / step_ms:.1f} % of the step.")
    print(f"engine-auto settled on a probe every {auto.instruments.cadence.interval} step(s).")
    if args.json:
        args.json.write_text(json.dumps({
            "workload": args.workload, "parameters": params, "batch_size": batch_size, "device": where,
            "torch": torch.__version__, "rounds": args.rounds, "steps_per_block": args.steps_per_block,
            "variants": figures, "probe_ms": probe_ms, "probe_share": probe_ms / step_ms,
            "auto_interval": auto.instruments.cadence.interval,
        }, indent=1))


if __name__ == "__main__":
    main()
