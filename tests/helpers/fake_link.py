"""A scripted stand-in for the trainer link: deterministic events in, recorded commands out.

It answers commands the way the real trainer does, one step later: ``SetCommand`` with
``OptionApplied`` at the next step (or ``OptionRefused`` for what a CPU trainer refuses: fp16, a world
size that does not divide the batch), pause/resume with a ``State``, save with ``CheckpointSaved``.
Answers are queued and come out of the next ``drain()``, as they would from the real link's buffer.
A world-size change answers as the trainer's supervisor does, in two parts: the checkpoint for the
relaunch comes out of the next drain, and the new ranks' resume, ``running`` and acknowledgement out of
the drain after it (in between, the real trainer says nothing for seconds).
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from metrics_rows import metrics_row

from torchlab.core.analysis.step_times import IN_TURN
from torchlab.core.wire import protocol
from torchlab.core.wire.events import MemoryPredicted
from torchlab.core.wire.metrics_row import MetricsRow
from torchlab.core.options import LiveOptions
from torchlab.core.wire.payloads import (
    AllocatorSample,
    GpuSample,
    HostSample,
    ImpactSegment,
    MemoryPrediction,
    ModuleInfo,
    ProcessSample,
    RankFigures,
    RunInfo,
    TelemetrySample,
)

RUN_DIR = "runs/20250101-120000-tiny_gpt"
#: As a trainer on a CPU reports them: pin_memory's auto is off there.
OPTIONS = LiveOptions(pin_memory=False).as_dict()


def module_names(blocks: int = 4) -> list[str]:
    names = ["tok_emb", "pos_emb"]
    for block in range(blocks):
        names += [f"blocks.{block}.{part}" for part in ("ln_1", "attn.qkv", "attn.proj", "ln_2", "mlp.fc", "mlp.proj")]
    return names + ["ln_f", "head"]


def welcome(step: int = 0, *, modules: list[str] | None = None, steps: int = 200, state: str = "running", options: dict | None = None,
            tied: dict[str, list[str]] | None = None, blocks: list[str] | None = None) -> protocol.Welcome:
    """``tied``: module -> the other modules holding its tied parameters; ``blocks``: the checkpoint blocks."""
    names = modules if modules is not None else module_names()
    options = dict(OPTIONS if options is None else options)
    blocks = blocks if blocks is not None else [f"blocks.{i}" for i in range(4)]
    return protocol.Welcome(
        run=RunInfo(
            workload="tiny_gpt", run_dir=RUN_DIR, device="cpu", steps=steps, batch_size=32, pid=4242,
            started=1_700_000_000.0, checkpoint_blocks=blocks, world_size=options["world_size"], ranks=[],
        ),
        modules=[ModuleInfo(name, 1000 + 37 * index * index, list((tied or {}).get(name, [])))
                 for index, name in enumerate(names)],
        options=options,
        state=state,
        step=step,
    )


def record(step: int, **overrides: Any) -> MetricsRow:
    """A metrics row like the trainer's, with a smooth deterministic loss and one spike at step 77."""
    loss = 4.5 * math.exp(-step / 40) + 1.2 + 0.05 * math.sin(step)
    if step == 77:
        loss = 5.0
    warmup = 10
    lr = 1e-3 * step / warmup if step <= warmup else 1e-3 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / 190))
    samples = 2000 + 150 * math.sin(step / 7)
    data = {
        "time": 1_700_000_000.0 + step * 0.016, "elapsed_s": round(step * 0.016 + 1.5, 3),
        "loss": loss, "lr": lr, "samples_per_s": samples, "step_time_s": 32 / samples,
        "grad_norm_total": 0.8 + 0.1 * math.cos(step / 5), "clipped": None, "skipped": False, **OPTIONS,
    }
    if step % 50 == 0:
        data["val_loss"] = loss + 0.08
    data.update(overrides)
    return metrics_row(step, **data)


def grad_norms(step: int, names: list[str] | None = None, *, updates: bool = False) -> protocol.GradNorms:
    """Per-module norms: mostly ~0.1, one vanishing LayerNorm, and the head rising fast near the end. ``updates``:
    with each module's update-to-weight ratio (~1e-3; blocks.2's ten times larger from step 80, as after a change;
    the vanishing LayerNorm's frozen at 1e-7) and weight norm."""
    names = names if names is not None else module_names()
    norms: list[float | None] = []
    for index, name in enumerate(names):
        norm = 0.05 + 0.01 * index + 0.005 * math.sin(step / 3 + index)
        if name == "blocks.3.ln_1":
            norm = 1e-9
        if name == "head" and step >= 118:
            norm = 5.0
        norms.append(norm)
    total = math.sqrt(sum(n * n for n in norms if n is not None))
    if not updates:
        return protocol.GradNorms(step=step, norms=norms, total=total)
    ratios = [1e-7 if name == "blocks.3.ln_1" else
              (1e-2 if name.startswith("blocks.2.") and step >= 80 else 1e-3) * (1 + 0.3 * math.sin(step / 5 + index))
              for index, name in enumerate(names)]
    weights = [1.0 + 0.1 * index for index in range(len(names))]
    return protocol.GradNorms(step=step, norms=norms, total=total, ratios=ratios, weights=weights)


def training_events(steps: int = 120, *, names: list[str] | None = None, world_size: int = 1,
                    tied: dict[str, list[str]] | None = None, blocks: list[str] | None = None,
                    updates: bool = False) -> list[protocol.Message]:
    """Welcome, running, ``steps`` metrics records in batches, and grad norms every 2 steps (``updates``: with the
    update's figures)."""
    options = {**OPTIONS, "world_size": world_size}
    events: list[protocol.Message] = [welcome(0, modules=names, options=options, tied=tied, blocks=blocks),
                                      protocol.State("running", 0)]
    for start in range(1, steps + 1, 20):
        batch = list(range(start, min(start + 20, steps + 1)))
        events.append(protocol.Metrics.from_rows([record(step, world_size=world_size) for step in batch]))
        events.extend(grad_norms(step, names, updates=updates) for step in batch if step % 2 == 0)
    return events


NO_GPU = "no GPU: no NVIDIA driver (NVML library not found)"


def gpu(index: int = 0, *, used_gib: float = 41.2, **overrides: Any) -> GpuSample:
    """One GPU as ``core/engine/measure/nvml.py`` reports it."""
    sample = GpuSample(
        index=index, name="NVIDIA H100 80GB HBM3", memory_used_bytes=int(used_gib * 2**30),
        memory_total_bytes=int(79.6 * 2**30), utilization_percent=87.0, temperature_c=62.0, power_w=312.4,
        power_limit_w=700.0, sm_clock_mhz=1980.0, this_run_memory_bytes=int(40.1 * 2**30),
    )
    return replace(sample, **overrides)


def cpu_run_processes() -> list[ProcessSample]:
    """A CPU run's processes as the sampler lists them: the trainer, then its two DataLoader workers."""
    return [ProcessSample(pid=4242, name="trainer", cpu_percent=98.0, rss_bytes=int(700 * 2**20),
                          read_bytes_per_s=0.0, write_bytes_per_s=41.5 * 2**20),
            ProcessSample(pid=4250, name="data worker", cpu_percent=31.0, rss_bytes=int(56 * 2**20),
                          read_bytes_per_s=1.5 * 2**20, write_bytes_per_s=0.0),
            ProcessSample(pid=4251, name="data worker", cpu_percent=29.5, rss_bytes=int(56 * 2**20),
                          read_bytes_per_s=1.2 * 2**20, write_bytes_per_s=0.0)]


def telemetry(step: int = 120, *, gpus: list[GpuSample] | None = None, rss_mib: float = 812, t: float = 0.0,
              cores: list[float] | None = None, processes: list[ProcessSample] | None = None) -> protocol.Telemetry:
    """A system sample like the trainer's sampler sends; without ``gpus``, a box with no NVIDIA driver. Without
    ``cores`` and ``processes``, a sample as the sampler wrote them before it took those (no disk figures either)."""
    gpus = gpus or []
    processes = processes or []
    reads = [process.read_bytes_per_s for process in processes if process.read_bytes_per_s is not None]
    writes = [process.write_bytes_per_s for process in processes if process.write_bytes_per_s is not None]
    on_gpu = bool(gpus)
    return protocol.Telemetry(sample=TelemetrySample(
        time=1_700_000_000.0 + t, step=step,
        host=HostSample(cpu_percent=23.0, cpu_count=16, trainer_cpu_percent=98.0, ram_used_bytes=int(21.0 * 2**30),
                        ram_total_bytes=int(125.7 * 2**30), trainer_rss_bytes=int(rss_mib * 2**20), trainer_processes=3,
                        cpu_percent_per_core=cores or [], processes=processes,
                        io_read_bytes_per_s=sum(reads) if reads else None, io_write_bytes_per_s=sum(writes) if writes else None),
        gpus=gpus,
        gpu_status=f"{len(gpus)} GPU(s)" if on_gpu else NO_GPU,
        torch=AllocatorSample(device="cuda:0" if on_gpu else "cpu", allocated_bytes=12 * 2**30 if on_gpu else None,
                              reserved_bytes=14 * 2**30 if on_gpu else None, peak_allocated_bytes=13 * 2**30 if on_gpu else None),
    ))


def profile_row(name: str, self_cpu_us: float, *, calls: int = 10, shapes: str = "", memory: int = 0) -> dict[str, Any]:
    return {
        "name": name, "input_shapes": shapes, "calls": calls, "self_cpu_us": self_cpu_us, "cpu_total_us": self_cpu_us * 1.5,
        "self_device_us": 0.0, "device_total_us": 0.0, "self_cpu_memory_bytes": memory, "self_device_memory_bytes": 0,
    }


def profile_ready(first_step: int, *, scale: float = 1.0, directory: str | None = None, error: str | None = None) -> protocol.ProfileReady:
    """A snapshot of a small model: ``scale`` multiplies the matmul time (0.5: the same ops, matmuls twice as fast)."""
    rows = [
        profile_row("aten::addmm", 4000.0 * scale, calls=40, memory=3 * 2**20),
        profile_row("aten::mm", 2500.0 * scale, calls=80, memory=2**20),
        profile_row("aten::gelu", 900.0, calls=20, memory=4 * 2**20),
        profile_row("aten::layer_norm", 600.0, calls=40, memory=-2**19),
        profile_row("aten::softmax", 300.0, calls=5000),
    ]
    by_shape = [
        dict(profile_row("aten::addmm", 3000.0 * scale, calls=20), input_shapes="[[64], [32, 64], [64, 64]]"),
        dict(profile_row("aten::addmm", 1000.0 * scale, calls=20), input_shapes="[[256], [32, 64], [64, 256]]"),
        dict(profile_row("aten::mm", 2500.0 * scale, calls=80), input_shapes="[[32, 64], [64, 64]]"),
    ]
    return protocol.ProfileReady(
        first_step=first_step, last_step=first_step + 4, dir=directory or f"{RUN_DIR}/profiles/{first_step - 1:07d}",
        rows=[] if error else rows, rows_by_shape=[] if error else by_shape, sort="self_cpu_us", build_s=0.4, error=error,
    )


def impact(*, bf16_steps: int = 40, clip_steps: int = 0) -> protocol.Impact:
    """Two segments: the start, then amp=bf16 at step 121, 1.72x faster with 45 % fewer activation bytes; with
    ``clip_steps``, a third after them, clip=1.0, whose step time is within the noise of bf16's."""
    start = ImpactSegment(
        change="start", options=dict(OPTIONS), first_step=1, last_step=120, median_step_time_s=0.0172,
        step_time_low_s=0.0166, step_time_high_s=0.0178, median_samples_per_s=1860.0, median_data_wait_s=0.0009, peak_allocated_bytes=None, nvml_run_bytes=None, others_cpu_percent=None,
        activations_bytes=48 * 2**20, tensor_bytes=61 * 2**20, loss_slope_per_100_steps=-2.41, speedup=None,
        memory_change=None, activations_change=None, verdict="start",
    )
    bf16 = ImpactSegment(
        change="amp=bf16", options={**OPTIONS, "amp": "bf16"}, first_step=121, last_step=120 + bf16_steps,
        median_step_time_s=0.0100, step_time_low_s=0.0098, step_time_high_s=0.0104, median_samples_per_s=3200.0, median_data_wait_s=0.0009,
        peak_allocated_bytes=None, nvml_run_bytes=None, others_cpu_percent=None, activations_bytes=26 * 2**20, tensor_bytes=39 * 2**20, loss_slope_per_100_steps=-0.52,
        speedup=1.72, memory_change=-0.36, activations_change=-0.46, verdict="amp=bf16: 1.72x faster, activations -46 %, memory -36 %",
        baseline_step=1,
    )
    clip = ImpactSegment(
        change="clip=1.0", options={**OPTIONS, "amp": "bf16", "clip": 1.0}, first_step=121 + bf16_steps,
        last_step=120 + bf16_steps + clip_steps, median_step_time_s=0.0103, step_time_low_s=0.0095,
        step_time_high_s=0.0118, median_samples_per_s=3110.0, median_data_wait_s=0.0008, peak_allocated_bytes=None, nvml_run_bytes=None, others_cpu_percent=None, activations_bytes=26 * 2**20,
        tensor_bytes=39 * 2**20, loss_slope_per_100_steps=-0.31, speedup=None, memory_change=0.0, activations_change=0.0,
        verdict=f"clip=1.0: no clear difference (±20 %, {IN_TURN}), same memory", baseline_step=121,
    )
    return protocol.Impact(segments=[start, bf16, clip] if clip_steps else [start, bf16])


def past_ended(events: list[protocol.Message]) -> list[protocol.Message]:
    """``events`` with a ``Replayed`` after each Welcome not followed by one, as the trainer's server sends
    (here the run has no past: what follows the welcome is news, as for an app that started the run)."""
    out: list[protocol.Message] = []
    for index, event in enumerate(events):
        out.append(event)
        following = events[index + 1] if index + 1 < len(events) else None
        if isinstance(event, protocol.Welcome) and not isinstance(following, protocol.Replayed):
            out.append(protocol.Replayed(events=0))
    return out


class FakeLink:
    """Implements the app's link interface; ``sent`` holds every command the app sent, in order."""

    def __init__(self, events: list[protocol.Message] | None = None, *, log_path: Path | None = None) -> None:
        self.queue: list[protocol.Message] = list(events if events is not None else training_events())
        self.sent: list[protocol.Message] = []
        self.started = False
        self.closed: dict[str, bool] | None = None
        self.restarts: list[bool] = []
        #: the options each restart was asked to apply from its first step (set on the error screen)
        self.restart_options: list[dict[str, Any]] = []
        self.run_dir: Path | None = None
        self.log_path = log_path
        self.step = 0
        self.state = "connecting"
        self.options = dict(OPTIONS)
        self.relaunched: list[protocol.Message] = []  # what the next drain after a relaunch's checkpoint releases
        # Scripted answers for the paths the tests take (the real trainer profiles and detaches).
        self.profile_refusal = "a profile is already recording (from step 118)"
        self.detach_acknowledged = True
        #: what a restart would resume from (the real link reads the run's checkpoints), and how the trainer exited
        self.checkpoint_to_restart_from: str | None = "step-0000100.pt, step 100"
        self.trainer_exit_code: int | None = None
        #: what the trainer says as it ends, once the app's close asked it to (a hung run that the stop ended fails)
        self.said_on_close: list[protocol.Message] = []

    # ------------------------------------------------------------------ the link interface

    def start(self) -> None:
        self.started = True
        self.run_dir = Path(RUN_DIR)

    def drain(self) -> list[protocol.Message]:
        out, self.queue = past_ended(self.queue), []
        self.queue, self.relaunched = self.relaunched, []
        for event in out:
            if isinstance(event, protocol.Metrics):
                self.step = max([self.step] + [step for step in event.columns.get("step", []) if isinstance(step, int)])
            elif isinstance(event, (protocol.State, protocol.Welcome)):
                self.step = max(self.step, event.step)
                self.state = event.state
        return out

    def send(self, command: protocol.Message) -> None:
        self.sent.append(command)
        at = self.step + 1
        if isinstance(command, protocol.SetCommand):
            self.push(self._answer_set(command, at))
        elif isinstance(command, protocol.PauseCommand):
            self.push(protocol.State("paused", self.step))
        elif isinstance(command, protocol.ResumeCommand):
            self.push(protocol.State("running", self.step))
        elif isinstance(command, protocol.SaveCheckpointCommand):
            self.push(protocol.CheckpointSaved(at, f"{RUN_DIR}/checkpoints/step-{at:07d}.pt", "requested"))
        elif isinstance(command, protocol.ProfileCommand):
            self.push(protocol.OptionRefused("profile", command.steps, self.profile_refusal, at, "app"))
        elif isinstance(command, protocol.DetachCommand):
            if self.detach_acknowledged:
                self.push(protocol.Detached(self.step))

    def close(self, *, detach: bool = False) -> None:
        self.closed = {"detach": detach}
        self.push(*self.said_on_close)

    def detach_and_wait(self, timeout_s: float = 3.0) -> bool:
        """A hang-up's detach: acknowledged unless ``detach_acknowledged`` is False (a trainer that hangs)."""
        self.sent.append(protocol.DetachCommand())
        return self.detach_acknowledged

    def restart(self, resume: bool, options: dict[str, Any] | None = None) -> None:
        self.restarts.append(resume)
        self.restart_options.append(dict(options or {}))
        self.push(welcome(100, options={**self.options, **(options or {})}), protocol.State("running", 100))

    def restart_point(self) -> str | None:
        return self.checkpoint_to_restart_from

    # ------------------------------------------------------------------ scripting

    def push(self, *events: protocol.Message) -> None:
        self.queue.extend(events)

    def sent_of(self, kind: type) -> list[protocol.Message]:
        return [command for command in self.sent if isinstance(command, kind)]

    def _answer_set(self, command: protocol.SetCommand, at: int) -> protocol.Message:
        if command.option == "amp" and command.value == "fp16":
            return protocol.OptionRefused("amp", "fp16", "fp16 needs CUDA; this run is on cpu: use bf16", at, "app")
        if command.option in ("world_size", "parallel"):
            return self._relaunch(command.option, command.value, at)
        previous = self.options.get(command.option)
        self.options[command.option] = command.value
        return protocol.OptionApplied(command.option, command.value, previous, at, "app")


    def _relaunch(self, option: str, value: Any, at: int) -> protocol.Message:
        """As core/engine/ranks/supervisor.py does: refuse a size that does not divide the batch; else checkpoint now, and
        (one drain later) resume, running, and the acknowledgement at the step the new ranks start."""
        if option == "world_size" and 32 % value:
            return protocol.OptionRefused(
                "world_size", value, f"world size {value} does not divide the batch of 32 (the global batch stays 32 "
                "and each rank takes an equal share): choose a divisor of 32", at, "app")
        previous, self.options[option] = self.options[option], value
        self.relaunched = [
            protocol.Log("info", f"resumed from the checkpoint of step {self.step}", self.step),
            protocol.State("running", self.step),
            protocol.OptionApplied(option, value, previous, at, "app"),
        ]
        return protocol.CheckpointSaved(self.step, f"{RUN_DIR}/checkpoints/step-{self.step:07d}.pt", option)


def ranks(step: int = 120, *, count: int = 2, step_time_s: float = 0.25, slow: dict[int, dict[str, float]] | None = None,
          on_gpu: bool = False) -> protocol.Ranks:
    """Per-rank figures as rank 0 gathers them: alike (5 ms apart), except what ``slow`` sets for a rank,
    e.g. ``{1: {"data_wait_s": 0.05}}``. Allocator figures only ``on_gpu`` (null on CPU, as the trainer sends)."""
    figures = []
    for rank in range(count):
        entry = RankFigures(
            rank=rank, step_time_s=step_time_s + 0.005 * rank, data_wait_s=0.0004,
            allocated_bytes=11 * 2**30 if on_gpu else None, reserved_bytes=13 * 2**30 if on_gpu else None,
            peak_allocated_bytes=12 * 2**30 if on_gpu else None, rss_bytes=(380 + rank) * 2**20,
        )
        figures.append(replace(entry, **(slow or {}).get(rank, {})))
    return protocol.Ranks(step=step, ranks=figures)


#: The settings the fake trainer runs with, as a prediction names them (``welcome``: batch 32, options at their defaults).
PREDICTED_IN_FORCE = {"amp": "off", "checkpointing": False, "split": 1, "accum": 1, "batch_size": 32, "world_size": 1,
                      "parallel": "ddp", "reshard_after_forward": True}


def memory_predicted(change: str, peak_gib: float, verdict: str = "yes", *, refused: str | None = None,
                     longest: int | None = None, **settings: Any) -> MemoryPredicted:
    """A prediction as the run's forecaster sends it, of a rank with an 80 GiB GPU, half of its peak activations;
    ``settings`` change those in force; ``refused``: a setting that cannot run here, and why; ``longest``: the
    elements of the run's longest batch it was predicted with (None: the dataset's first samples)."""
    full = {**PREDICTED_IN_FORCE, **settings}
    peak = 0 if refused else int(peak_gib * 2**30)
    at_peak = {"parameters": peak // 8, "gradients": peak // 8, "optimizer": peak // 4, "activations": peak // 2,
               "gathered": 0, "other": 0}
    return MemoryPredicted(step=120, settings=full, change=change, capacity_bytes=80 * 2**30,
                           capacity="80 GiB per rank (NVIDIA H100 80GB HBM3, by NVML)", verdict="" if refused else verdict,
                           longest_batch_elements=longest,
                           prediction=MemoryPrediction(settings=full, peak_bytes=peak, at_peak=at_peak,
                                                       parameters_bytes=peak // 8, gradients_bytes=peak // 8,
                                                       optimizer_bytes=peak // 4, activations_bytes=peak // 2,
                                                       gathered_bytes=0, seconds=0.4, refused=refused))


def quiet_app(link):
    """The app as ``TorchlabApp`` builds it, with its timers slowed to a crawl and its clock stopped: tests call
    ``poll_now()`` themselves, so answers arrive exactly when a test says, and the gradient table updates at once."""
    from torchlab.tui.app import TorchlabApp

    app = TorchlabApp(link, poll_interval=3600, log_poll_interval=3600, grad_refresh_interval=0)
    app.run_state.clock = lambda: 0.0  # the header's clock stands still: no second passes between reports
    return app


def long_names_events(steps: int = 120) -> list[protocol.Message]:
    """A run of ``tests/workloads/long_names.py`` (HuggingFace BERT's names, a tied lm_head) as its trainer
    names it: the modules come from the trainer's own probe."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent.parent / "workloads"))
    import long_names

    modules = long_names.module_names()
    names = [name for name, _, _ in modules]
    tied = {name: others for name, _, others in modules if others}
    blocks = [f"bert.encoder.layer.{index}" for index in range(long_names.LAYERS)]
    return training_events(steps, names=names, tied=tied, blocks=blocks)
