"""Data-parallel scaling on the CPU, and what keeping the ranks in step costs.

    .venv/bin/python -m benchmarks.ddp_scaling                        # tiny_gpt and mlp, 60 steps each
    .venv/bin/python -m benchmarks.ddp_scaling --workloads mlp --steps 200

1. Scaling: the same run (same global batch, so each of 2 ranks computes half of it) at world size 1
   (in-process) and 2 (two rank processes under the elastic launcher, gloo), through the real headless
   entry point, alternating 1 and 2 for ``--rounds`` rounds. Per run: the median step time after a
   warm-up; per size: the median over rounds (and the range). Also the time from start to the first
   step (rank processes import torch and meet at the rendezvous).
   ``--neighbour``: the same, on a box that something else also uses (issue 45, item 9): a process that spins
   one core (``while True: pass``) runs through every run, and each run is a ``torchlab-tui`` process of its own
   (its wall time is what a user waits), so the OpenMP settings the command line makes before torch loads
   count. ``--environment NAME=VALUE`` adds a variable to every run's environment (``OMP_WAIT_POLICY=active``
   shows what the waiting policy does).
2. The per-step collectives between 2 ranks, timed in the ranks themselves over many calls: the step
   boundary's command packet (``Collectives.share``, one broadcast of a 1 KiB uint8 tensor), the same
   payload through ``broadcast_object_list`` (pickle, two collectives) for comparison, the global mean
   loss (``all_reduce`` of one float) and the per-rank figures of a report (``all_gather`` of 6 floats).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

WARMUP_STEPS = 10


def scaling(workload: str, world_size: int, steps: int, environment: dict[str, str]) -> dict[str, float]:
    """One headless run in a process of its own, as a user starts it."""
    with tempfile.TemporaryDirectory() as directory:
        run = Path(directory) / "run"
        started = time.time()
        finished = subprocess.run(
            [sys.executable, "-m", "torchlab.core.launch.cli", workload, "--headless", "--run-dir", str(run),
             "--world-size", str(world_size), "--steps", str(steps), "--telemetry-interval", "0",
             "--checkpoint-every", "0", "--eval-every", "0", "--schedule", "constant"],
            env={**os.environ, **environment}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wall = time.time() - started
        assert finished.returncode == 0, f"{workload} at world size {world_size} exited {finished.returncode}: {finished.stderr}"
        metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        first = metrics[0]["time"] - metrics[0]["step_time_s"]
    times = [record["step_time_s"] for record in metrics[WARMUP_STEPS:]]
    step = statistics.median(times)
    return {
        "step_ms": 1000 * step,
        "steps_per_s": 1 / step,
        "samples_per_s": statistics.median(record["samples_per_s"] for record in metrics[WARMUP_STEPS:]),
        "start_s": first - started,
        "wall_s": wall,
        "batch": metrics[0]["samples_per_s"] * metrics[0]["step_time_s"],
    }


@contextlib.contextmanager
def busy_neighbour(on: bool, limit_s: int):
    """A process that spins one core for as long as the runs take (and never longer than ``limit_s``)."""
    if not on:
        yield
        return
    spinner = subprocess.Popen(["timeout", str(limit_s), sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        spinner.terminate()
        spinner.wait()


def _time_collectives(calls: int) -> dict[str, float]:
    """Runs in each rank (started by the elastic launcher): microseconds per call of each collective."""
    import torch
    import torch.distributed as dist

    from torchlab.core.engine.parallel.distributed import Collectives, open_process_group, rank_from_environment
    from torchlab.core.wire.protocol import SetCommand

    context = rank_from_environment(supervised=True)
    device = torch.device("cpu")
    open_process_group(context, device)
    collectives = Collectives(context, device)
    payload = {"probe": True, "more": False, "commands": [SetCommand("clip", 0.5, "app").json_text()]}
    empty = {"probe": False, "more": False, "commands": []}

    def timed(function) -> float:
        for _ in range(20):
            function()
        dist.barrier()
        started = time.perf_counter()
        for _ in range(calls):
            function()
        return 1e6 * (time.perf_counter() - started) / calls

    def object_broadcast():
        box = [json.dumps(payload)] if context.rank == 0 else [None]
        dist.broadcast_object_list(box, src=0)

    loss = torch.tensor(0.5)
    results = {
        "share, empty boundary": timed(lambda: collectives.share(empty if context.rank == 0 else None)),
        "share, one command": timed(lambda: collectives.share(payload if context.rank == 0 else None)),
        "broadcast_object_list, same payload": timed(object_broadcast),
        "mean loss (all_reduce)": timed(lambda: collectives.mean_loss(loss)),
        "per-rank figures (all_gather)": timed(lambda: collectives.gather_figures(0.1, 0.01)),
    }
    dist.destroy_process_group()
    return results


def collective_costs(calls: int) -> dict[str, float]:
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    with tempfile.TemporaryDirectory() as logs:
        config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, run_id=uuid.uuid4().hex, rdzv_backend="c10d",
                              rdzv_endpoint="localhost:0", max_restarts=0, logs_specs=DefaultLogsSpecs(log_dir=logs))
        per_rank = elastic_launch(config, _time_collectives)(calls)
    return per_rank[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="+", default=["tiny_gpt", "mlp"])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--neighbour", action="store_true", help="a process spinning one core runs throughout")
    parser.add_argument("--environment", action="append", default=[], metavar="NAME=VALUE",
                        help="a variable for every run's environment (repeatable)")
    parser.add_argument("--skip-collectives", action="store_true")
    args = parser.parse_args()
    environment = dict(item.split("=", 1) for item in args.environment)
    import torch

    from torchlab.core.cpu_share import cgroup_quota_cores, decide_threads, usable_cores

    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs ({usable_cores()} usable, cgroup quota "
          f"{cgroup_quota_cores()}), Python {sys.version.split()[0]}, load average {os.getloadavg()[0]:.1f} at start; "
          f"threads decided: {decide_threads(1).threads} at world size 1, {decide_threads(2).threads} a rank at 2; "
          f"neighbour: {'one spinning process' if args.neighbour else 'none'}; environment: {environment or 'as is'}")
    rows = []
    with busy_neighbour(args.neighbour, limit_s=3600):
        for workload in args.workloads:
            runs: dict[int, list[dict[str, float]]] = {1: [], 2: []}
            for round_ in range(args.rounds):
                for size in ((1, 2) if round_ % 2 == 0 else (2, 1)):
                    runs[size].append(scaling(workload, size, args.steps, environment))
                    print(f"  {workload} world size {size}: {runs[size][-1]['step_ms']:.1f} ms a step, "
                          f"{runs[size][-1]['wall_s']:.1f} s in all", flush=True)
            base = statistics.median(run["samples_per_s"] for run in runs[1])
            for size, results in runs.items():
                step = [run["step_ms"] for run in results]
                rows.append(f"| {workload} (batch {results[0]['batch']:.0f}) | {size} | {statistics.median(step):.1f} "
                            f"({min(step):.1f}–{max(step):.1f}) | {1000 / statistics.median(step):.2f} | "
                            f"{statistics.median(run['samples_per_s'] for run in results):,.0f} | "
                            f"{statistics.median(run['samples_per_s'] for run in results) / base:.2f}x | "
                            f"{statistics.median(run['wall_s'] for run in results):.1f} s | "
                            f"{statistics.median(run['start_s'] for run in results):.1f} s |")
    print(f"\n| workload | world size | step ms, median (range) over {args.rounds} runs | steps/s | samples/s | vs 1 | "
          "wall, median | start to first step |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    if args.skip_collectives:
        return
    print(f"\nCollectives between 2 CPU ranks (gloo), microseconds per call, rank 0, {args.calls} calls each:")
    for name, micros in collective_costs(args.calls).items():
        print(f"  {name:40s} {micros:8.1f} us")


if __name__ == "__main__":
    main()
