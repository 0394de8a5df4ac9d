"""DDP against FSDP2 (``parallel``) on the same ranks: what each holds per rank, how fast each steps, and what a switch
between them costs.

    .venv/bin/python benchmarks/parallel_cost.py                       # tiny_gpt, 2 ranks, 5 segments of 30 steps
    .venv/bin/python benchmarks/parallel_cost.py --workload gpt100m --device cuda --world-size 1 --torchrun

One headless run switches ``parallel`` at every ``--segment`` steps (ddp, fsdp, ddp, ...), live, as a key would: the
ranks relaunch from a checkpoint at each switch. A segment's speed is the median of its step times past its first
``--settle`` steps (a relaunched rank's first steps warm up); an fsdp segment's ratio is to the mean of the ddp
segments either side of it, so slow drift hits both alike, and the figure is the median of those ratios. Memory is
rank 0's by kind (memory by kind, every 5 steps): parameters + gradients + optimizer state (what sharding divides),
activations, and the gathered parameters forward saves for backward. The switch's cost is the wall time from the
trainer's ``relaunching`` to the new ranks' acknowledgement.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = {"tiny_gpt": "tiny_gpt", "gpt100m": f"{ROOT / 'benchmarks' / 'gpt100m.py'}:workload"}


def run(workload: str, world_size: int, segments: int, segment: int, device: str, run_dir: Path,
        torchrun: bool) -> tuple[list[dict], list[dict]]:
    """The run's metrics rows and events. ``torchrun``: each segment its own run under torchrun (which cannot
    relaunch: the only way at world size 1, where torchlab's own supervisor trains in-process, unsharded)."""
    modes = ["ddp" if index % 2 == 0 else "fsdp" for index in range(segments)]
    settings = [WORKLOADS.get(workload, workload), "--headless", "--device", device, "--checkpoint-every", "0",
                "--eval-every", "0", "--memory-every", "5", "--telemetry-interval", "0"]
    if not torchrun:
        command = [sys.executable, "-m", "torchlab.core.launch.cli", *settings, "--world-size", str(world_size),
                   "--steps", str(segments * segment), "--run-dir", str(run_dir)]
        for index, mode in enumerate(modes[1:], start=1):
            command += ["--at", f"{1 + index * segment}:parallel={mode}"]
        _quietly(command)
        return _jsonl(run_dir / "metrics.jsonl"), _jsonl(run_dir / "events.jsonl")
    rows: list[dict] = []
    for index, mode in enumerate(modes):
        segment_dir = run_dir.with_name(f"{run_dir.name}-{index}")
        _quietly([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world_size),
                        "-m", "torchlab.core.launch.cli", *settings, "--parallel", mode, "--steps", str(segment),
                        "--run-dir", str(segment_dir)])
        rows += [{**row, "step": row["step"] + index * segment} for row in _jsonl(segment_dir / "metrics.jsonl")]
    return rows, []


def _quietly(command: list[str]) -> None:
    """Run ``command``; its output only where it fails."""
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{' '.join(command[:6])}... failed ({done.returncode}):\n{done.stderr[-3000:]}")


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def report(rows: list[dict], events: list[dict], segment: int, settle: int) -> None:
    segments: list[tuple[str, list[dict]]] = []
    for row in rows:
        if not segments or (row["step"] - 1) % segment == 0:
            segments.append((row["parallel"], []))
        segments[-1][1].append(row)
    speeds = [(mode, statistics.median(r["step_time_s"] for r in seg[settle:])) for mode, seg in segments]
    ratios = []
    for index, (mode, time_s) in enumerate(speeds):
        if mode == "fsdp" and 0 < index < len(speeds) - 1:
            ratios.append(time_s / ((speeds[index - 1][1] + speeds[index + 1][1]) / 2))
    print(f"step time, median of each segment past its first {settle} steps (s):",
          ", ".join(f"{mode} {time_s:.4f}" for mode, time_s in speeds))
    if ratios:
        ratios.sort()
        print(f"fsdp / ddp step time: {statistics.median(ratios):.2f}x (segments: "
              f"{', '.join(f'{ratio:.2f}' for ratio in ratios)})")
    for mode in ("ddp", "fsdp"):
        measured = [r["memory"] for r in rows if r["parallel"] == mode and r.get("memory")]
        if not measured:
            continue
        last = measured[-1]
        held = last["parameters_bytes"] + last["gradients_bytes"] + last["optimizer_bytes"]
        print(f"{mode}: rank 0 holds parameters+gradients+optimizer {held / 2**20:.2f} MiB "
              f"(parameters {last['parameters_bytes'] / 2**20:.2f}), activations {last['activations_bytes'] / 2**20:.2f} "
              f"MiB, gathered parameters {last.get('gathered_bytes', 0) / 2**20:.2f} MiB"
              + (f", allocator peak {last['allocator_peak_bytes'] / 2**20:.0f} MiB" if last.get("allocator_peak_bytes") else ""))
    started = {e["step"]: e["time"] for e in events if e["event"] == "relaunching"}
    switches = [e["time"] - started[e["step"] - 1] for e in events
                if e["event"] == "option_applied" and e["option"] == "parallel" and e["step"] - 1 in started]
    if switches:
        print(f"a switch (checkpoint, relaunch, resume): median {statistics.median(switches):.1f} s "
              f"({min(switches):.1f}-{max(switches):.1f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="tiny_gpt", help="tiny_gpt, gpt100m or path.py:factory")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--segments", type=int, default=5, help="alternating ddp and fsdp segments, from ddp")
    parser.add_argument("--segment", type=int, default=30, help="steps a segment")
    parser.add_argument("--settle", type=int, default=5, help="a segment's first steps left out of its speed")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--torchrun", action="store_true", help="each segment its own run under torchrun (world size 1)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        rows, events = run(args.workload, args.world_size, args.segments, args.segment, args.device,
                           Path(directory) / "run", args.torchrun)
        report(rows, events, args.segment, args.settle)


if __name__ == "__main__":
    main()
