"""How close the memory forecast comes to the memory the trainer measures (issue 49's table).

    .venv/bin/python benchmarks/memory_forecast.py                  # every model and setting (~5 min on 2 cores)
    .venv/bin/python benchmarks/memory_forecast.py --models mlp --settings off bf16

For each model and setting, a real run trains 3 steps headless with ``--memory-every 1`` (its own process, or two
ranks for FSDP2) and its last step's memory by kind is read from ``metrics.jsonl`` (rank 0's: core/engine/measure/
memory.py counts the tensors themselves, the same on a CPU as on CUDA); the forecast predicts the same settings as
``torchlab-tui plan`` does (core/engine/forecast/forecasting.py), on fake tensors. Printed: each kind's error and the
total's (parameters + gradients + optimizer state + activations + gathered, what both count), and the forecast's
peak: on a CPU against the same step's peak on real tensors under MemTracker (this file's own step), on a GPU
(``--device cuda``, the GPU pass's ``forecast`` stage) against the CUDA allocator's peak the run measured
(``max_memory_allocated`` since the run's settings came in force, the memory view's ``allocator_peak_bytes``). A
markdown table for ``benchmarks/README.md``.

    .venv/bin/python benchmarks/memory_forecast.py --device cuda --models mlp convnet tiny_gpt --settings off bf16
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WORKLOADS = ROOT / "tests" / "workloads"
MODELS = {"mlp": "mlp", "convnet": "convnet", "tiny_gpt": "tiny_gpt",
          "tied_batchnorm": f"{WORKLOADS / 'tied_batchnorm.py'}:workload",
          "hf_gpt2_trainer": f"{WORKLOADS / 'hf_trainer.py'}:workload",  # a transformers Trainer, as it is
          "lightning": f"{WORKLOADS / 'lightning_module.py'}:module"}  # a LightningModule, as it is
SETTINGS = {
    "off": [],
    "bf16": ["--amp", "bf16"],
    "checkpointing": ["--checkpointing"],
    "split=2": ["--split", "2"],
    "accum=2": ["--accum", "2"],
    "fsdp×2": ["--world-size", "2", "--parallel", "fsdp"],
    "fsdp×2 bf16 ckpt": ["--world-size", "2", "--parallel", "fsdp", "--amp", "bf16", "--checkpointing"],
}
KINDS = ("parameters", "gradients", "optimizer", "activations", "gathered")


def measured(spec: str, flags: list[str], folder: Path) -> tuple[dict[str, int], int | None]:
    """Each kind of the last step measured, and on CUDA the allocator's peak since the run's settings came in force."""
    run = folder / "run"
    command = [sys.executable, "-m", "torchlab.core.launch.cli", spec, "--headless", "--steps", "3", "--memory-every", "1",
               "--eval-every", "0", "--probe-every", "0", "--run-dir", str(run), *flags]
    subprocess.run(command, check=True, capture_output=True, text=True)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    memory = [row["memory"] for row in rows if row.get("memory")][-1]
    return {kind: memory[f"{kind}_bytes"] for kind in KINDS}, memory.get("allocator_peak_bytes")


def predicted(spec: str, flags: list[str]) -> tuple[dict[str, int], int, object]:
    from torchlab.core.launch.arguments import resolve_config
    from torchlab.core.engine.forecast.forecasting import Forecasting
    from torchlab.core.launch.plan import build_plan_parser

    args = build_plan_parser().parse_args([spec, *flags])
    forecasting = Forecasting.load(*resolve_config(args))
    prediction, cannot = forecasting.predict(forecasting.configured)
    if cannot is not None:
        raise cannot
    return {kind: getattr(prediction, f"{kind}_bytes") for kind in KINDS}, prediction.peak_bytes, forecasting.configured


def real_peak(spec: str, shape, device: str) -> int | None:
    """The peak of the same step on real tensors, tracked by MemTracker (what the fake prediction must equal): two
    steps of the model as loaded, the second's peak. Written here apart from the forecast's own step, so the check
    does not share its code. ``shape``: the settings the forecast predicted (the flags, and the workload's own). None
    for ranks (their peak is the GPU issue's, against the CUDA allocator)."""
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.utils.data import DataLoader

    from torchlab.core.engine.activation_checkpointing import ActivationCheckpointing
    from torchlab.core.engine.adapters.loading import load_workload
    from torchlab.core.engine.batch_split import split_batch
    from torchlab.core.engine.data import map_batch_tensors
    from torchlab.core.engine.loss_output import read_loss_output
    from torchlab.core.engine.optimization import build_optimizer
    from torchlab.core.records.config import build_config

    if shape.world_size > 1 or device != "cpu":  # ranks, and a GPU: the allocator's own peak is measured instead
        return None
    workload = load_workload(spec)
    model = workload.model  # as it is: a transformers Trainer's optimizer is built on the model it holds
    if shape.checkpointing:
        ActivationCheckpointing(model, workload.checkpoint_blocks).enable()
    amp, split = shape.amp, shape.split
    passes = min(2, split * shape.accum)
    optimizer = build_optimizer(model, build_config({}, {"workload": spec}), workload)  # the run's own, as it builds it
    class Tracker(MemTracker):  # a LightningModule runs itself inside its own forward (training_step's self(x))
        def _pre_fw_hook(self, module, inputs):
            try:
                super()._pre_fw_hook(module, inputs)
            except NotImplementedError:
                pass

    tracker = Tracker()
    tracker.track_external(model, optimizer)
    # Drawn outside the tracker: a sample is a view of the dataset's storage, which the tracker would count whole.
    batch = next(iter(DataLoader(workload.dataset, batch_size=shape.batch_size, collate_fn=workload.collate_fn)))
    with tracker:
        batch = map_batch_tensors(batch, torch.clone)
        piece = split_batch(batch, split)[0][0]
        for step in range(2):
            if step == 1:
                tracker._peak_mem, tracker._peak_mem_snap = {}, {}
            for _ in range(passes):
                tracker.reset_mod_stats()
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp == "bf16"):
                    loss, _ = read_loss_output(workload.loss_fn(model, piece), "loss_fn", torch.device("cpu"))
                loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]


def error(predicted_bytes: int, measured_bytes: int) -> str:
    if measured_bytes == 0:
        return "0" if predicted_bytes == 0 else "n/a"
    return f"{100 * (predicted_bytes - measured_bytes) / measured_bytes:+.1f} %"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--device", default="cpu", help="cpu (the default) or cuda: where the runs train and the forecast "
                                                        "predicts for")
    args = parser.parse_args()
    from torchlab.core.errors import TorchlabError
    from torchlab.core.units import format_bytes

    against = "peak on real tensors" if args.device == "cpu" else "CUDA allocator's peak"
    print("| model | settings | measured total | predicted total | total | parameters | gradients | optimizer "
          f"| activations | gathered | predicted peak | {against} |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    worst_total, worst_kind = 0.0, 0.0
    for model in args.models:
        for setting in args.settings:
            spec, flags = MODELS[model], [*SETTINGS[setting], "--device", args.device]
            with tempfile.TemporaryDirectory() as folder:
                real, allocator_peak = measured(spec, flags, Path(folder))
            try:
                fake, peak, shape = predicted(spec, flags)
            except TorchlabError as cannot:
                print(f"| {model} | {setting} | {format_bytes(sum(real.values()))} | cannot: {cannot} |", flush=True)
                continue
            real_step_peak = real_peak(spec, shape, args.device) if args.device == "cpu" else allocator_peak
            total_real, total_fake = sum(real.values()), sum(fake.values())
            worst_total = max(worst_total, abs(total_fake - total_real) / total_real)
            worst_kind = max([worst_kind] + [abs(fake[k] - real[k]) / real[k] for k in KINDS if real[k]])
            print(f"| {model} | {setting} | {format_bytes(total_real)} | {format_bytes(total_fake)} | "
                  f"{error(total_fake, total_real)} | " + " | ".join(error(fake[k], real[k]) for k in KINDS)
                  + f" | {format_bytes(peak)} | "
                  + (f"{format_bytes(real_step_peak)} ({error(peak, real_step_peak)}) |" if real_step_peak else "– |"),
                  flush=True)
    print(f"\nworst total error {100 * worst_total:.1f} %, worst kind error {100 * worst_kind:.1f} %")


if __name__ == "__main__":
    main()
