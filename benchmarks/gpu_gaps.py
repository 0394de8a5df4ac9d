"""Where a GPU waits for the host: the engine's steps and a bare loop's, profiled, their GPU idle gaps named.

``probe_overhead.py`` says how much slower the engine is than a plain loop; on a GPU-bound model that can only be
time the GPU spends idle, waiting for the host to queue work. This script traces a few steps of each under
``torch.profiler`` (CPU and CUDA activities), merges the kernels and copies into the GPU's busy intervals, and
reports the rest: the idle share of the traced wall time, the gaps over 20 µs, and which host work (PyTorch
operators and CUDA runtime calls) ran during the idle time, by total overlap. The host-side names say what to
move: the sync's wait (``cudaStreamSynchronize``, ``aten::item``), a batch's fetch (``aten::pin_memory``,
``aten::to``), the optimizer's launches, or Python between operators (idle time that no operator covers).

    python benchmarks/gpu_gaps.py --device cuda --workload gpt100m --json gaps_gpt100m.json

On a CPU there are no kernels: it says so (``gpu_pass.sh`` runs it there only to check the script).
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import tempfile
from pathlib import Path

import torch

import gpt100m
from probe_overhead import BareLoop, make_engine
from torchlab.core.engine.adapters.loading import load_workload
from torchlab.core.engine.seeding import seed_everything

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_CATEGORIES = ("cpu_op", "cuda_runtime", "cuda_driver")
MIN_GAP_US = 20.0


def busy_intervals(events: list[dict], categories: tuple[str, ...] = GPU_CATEGORIES) -> list[tuple[float, float]]:
    """The events of ``categories`` (by default the GPU's work: kernels, copies, sets) merged into disjoint
    intervals, in µs of the trace's clock."""
    spans = sorted((e["ts"], e["ts"] + e.get("dur", 0.0)) for e in events if e.get("cat") in categories)
    merged: list[list[float]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(start, end) for start, end in merged]


def idle_gaps(busy: list[tuple[float, float]]) -> list[tuple[float, float]]:
    return [(end, start) for (_, end), (start, _) in zip(busy, busy[1:]) if start - end >= MIN_GAP_US]


def host_work_in(gaps: list[tuple[float, float]], events: list[dict]) -> collections.Counter:
    """µs of each host operator or runtime call's overlap with the idle gaps (nested operators each count)."""
    overlap: collections.Counter = collections.Counter()
    host = sorted((e["ts"], e["ts"] + e.get("dur", 0.0), e["name"]) for e in events if e.get("cat") in HOST_CATEGORIES)
    for gap_start, gap_end in gaps:
        for start, end, name in host:
            if start >= gap_end:
                break
            shared = min(end, gap_end) - max(start, gap_start)
            if shared > 0:
                overlap[name] += shared
    return overlap


def uncovered(gaps: list[tuple[float, float]], events: list[dict]) -> float:
    """µs of the idle gaps during which no host operator or runtime call ran: the host in plain Python."""
    host = busy_intervals(events, HOST_CATEGORIES)
    covered = 0.0
    for gap_start, gap_end in gaps:
        for start, end in host:
            covered += max(0.0, min(end, gap_end) - max(start, gap_start))
    return sum(end - start for start, end in gaps) - covered


def analyse(trace: dict, steps: int) -> dict:
    events = [e for e in trace.get("traceEvents", []) if isinstance(e, dict) and "ts" in e]
    busy = busy_intervals(events)
    if not busy:
        return {"kernels": 0}
    window = busy[-1][1] - busy[0][0]
    gaps = idle_gaps(busy)
    idle = sum(end - start for start, end in gaps)
    overlap = host_work_in(gaps, events)
    return {
        "kernels": sum(1 for e in events if e.get("cat") == "kernel"),
        "wall_ms_per_step": window / 1000 / steps,
        "idle_share": idle / window,
        "idle_ms_per_step": idle / 1000 / steps,
        "gaps_per_step": len(gaps) / steps,
        "idle_in_python_ms_per_step": uncovered(gaps, events) / 1000 / steps,
        "longest_gaps_us": sorted((round(end - start, 1) for start, end in gaps), reverse=True)[:8],
        "host_work_in_gaps_ms_per_step": {name: round(us / 1000 / steps, 4) for name, us in overlap.most_common(15)},
    }


def traced(train_one_step, steps: int, device: torch.device) -> dict:
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
        torch.cuda.synchronize(device)
    with torch.profiler.profile(activities=activities) as profiler:
        for _ in range(steps):
            train_one_step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace.json"
        profiler.export_chrome_trace(str(path))
        return json.loads(path.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="gpt100m", help="a sample, gpt100m, or path.py:factory")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=10, help="steps traced per loop")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    spec = gpt100m.SPEC if args.workload == "gpt100m" else args.workload
    device = torch.device(args.device)
    seed_everything(0)
    template = load_workload(spec)
    batch_size = template.batch_size or 32
    loops = {
        "bare": BareLoop(copy.deepcopy(template), batch_size, 1e-3, device=device),
        "engine (probe off)": make_engine(copy.deepcopy(template), spec, batch_size, 1e-3, 0, args.device),
        "engine (probe auto)": make_engine(copy.deepcopy(template), spec, batch_size, 1e-3, "auto", args.device),
    }
    figures: dict = {"workload": args.workload, "torch": torch.__version__,
                     "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "loops": {}}
    print(f"{args.workload} on {figures['device']}, {args.steps} steps traced per loop")
    for name, loop in loops.items():
        loop.train_steps(10)  # warm-up: allocator, handles, the cadences
        found = analyse(traced(lambda loop=loop: loop.train_steps(1), args.steps, device), args.steps)
        figures["loops"][name] = found
        if not found["kernels"]:
            print(f"\n{name}: no GPU kernels in the trace (no CUDA device): nothing to analyse")
            continue
        print(f"\n{name}: {found['wall_ms_per_step']:.2f} ms a step, GPU idle {100 * found['idle_share']:.1f} % "
              f"({found['idle_ms_per_step']:.3f} ms a step in {found['gaps_per_step']:.1f} gaps ≥ {MIN_GAP_US:.0f} µs; "
              f"longest {found['longest_gaps_us'][:4]} µs)")
        print(f"    {found['idle_in_python_ms_per_step']:8.3f} ms  (no operator: the host in Python)")
        for host_name, ms in found["host_work_in_gaps_ms_per_step"].items():
            print(f"    {ms:8.3f} ms  {host_name}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
