"""The payloads nested in the protocol's events: what the run is, its modules, a system sample, the ranks'
figures, the impact table's rows. Standard library only.

Each is a frozen dataclass that its producer builds directly (the worker, the telemetry sampler, the ranks'
collectives, the impact tracker) and the app reads by attribute. ``protocol.decode`` validates them field by
field, like a message's own fields, as their annotations declare (core/wire/typed_json.py): a payload type is a
JSON object read as that payload, ``list[T]`` a list whose every item is read as ``T``, a ``float`` any finite
number. On the wire each is the JSON object of its fields (the names below are the JSON keys), which is also how
it appears in ``system.jsonl``, ``metrics.jsonl``, ``events.jsonl`` and ``impact.json``.

A figure that can be missing is ``None`` (NaN and Inf travel as null too): a CPU run has no allocator
figures, a GPU may hide its power draw.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torchlab.core.wire.typed_json import JsonObject


# ----------------------------------------------------------------------------- Welcome: the run


@dataclass(frozen=True)
class ModuleInfo(JsonObject):
    """One module whose gradient norm is measured, in the order of ``GradNorms.norms``. ``tied``: the other
    modules that hold some of its parameters (GPT-2's ``lm_head`` for ``transformer.wte``), counted here once."""

    name: str
    params: int
    tied: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class RankProcess(JsonObject):
    """Where one data-parallel rank runs (gathered once at start, as in ``run_started``)."""

    rank: int
    host: str
    pid: int
    device: str
    #: the node it runs on: torchrun's node rank (``GROUP_RANK``; 0 on one machine), which tells two nodes of one host
    node: int = 0


def rank_place(host: str, node: int, nodes: int) -> str:
    """Where a rank runs, as the rank table and a straggler's sentence name it: its node and host where the run spans
    several nodes ("node 1 (gpu-b)"), else its host."""
    return f"node {node} ({host})" if nodes > 1 else host


@dataclass(frozen=True)
class RunInfo(JsonObject):
    """The run an app attached to. ``device`` and ``batch_size`` are known once the trainer started (empty
    and 0 before); ``steps`` is the step the run trains to (0 when its settings could not be read);
    ``ranks`` lists the ranks above world size 1 (empty for a single process)."""

    workload: str
    run_dir: str
    device: str
    steps: int
    batch_size: int
    pid: int
    started: float  # the trainer process's start, seconds since the epoch
    checkpoint_blocks: list[str]
    world_size: int
    ranks: list[RankProcess]


# ----------------------------------------------------------------------------- Telemetry: a system sample


@dataclass(frozen=True)
class ProcessSample(JsonObject):
    """One process of the run: the trainer, a rank, a DataLoader worker. ``name`` says which, in words ("trainer",
    "rank 1", "data worker", "compile worker", else the OS's name for it); ``cpu_percent`` is of one CPU, as ``top``
    shows it; the disk figures are bytes a second since the last sample, None where the OS does not say."""

    pid: int
    name: str
    cpu_percent: float
    rss_bytes: int
    read_bytes_per_s: float | None
    write_bytes_per_s: float | None


@dataclass(frozen=True)
class HostSample(JsonObject):
    """The host's CPU and RAM, and the trainer's share: the CPU and the RSS of it and its children (DataLoader
    workers, ranks) together. ``cpu_percent`` is of the whole machine (0-100), ``trainer_cpu_percent`` of one CPU
    (up to ``cpu_count`` x 100, as ``top`` shows a process). ``cpu_count`` is None where the OS does not say.

    Then the detail the full-size view shows: each core's load (0-100, the mean of which is ``cpu_percent``), the
    run's processes (the trainer first, then the busiest), and the disk bytes a second the run's processes read and
    write. A sample written before these were taken has none of them: empty, and None."""

    cpu_percent: float
    cpu_count: int | None
    trainer_cpu_percent: float
    ram_used_bytes: int
    ram_total_bytes: int
    trainer_rss_bytes: int
    trainer_processes: int
    cpu_percent_per_core: list[float] = field(default_factory=list)
    processes: list[ProcessSample] = field(default_factory=list)
    io_read_bytes_per_s: float | None = None
    io_write_bytes_per_s: float | None = None

    @property
    def others_cpu_percent(self) -> float:
        """What other processes took of the whole machine's CPU (0-100): on a shared box, a change of it between
        two segments moves their step times as much as an option does."""
        return max(0.0, self.cpu_percent - self.trainer_cpu_percent / (self.cpu_count or 1))


@dataclass(frozen=True)
class GpuSample(JsonObject):
    """One GPU as NVML reports it; each figure None where this GPU hides it. ``this_run_memory_bytes``: the
    memory NVML attributes to this run's processes (None where it lists no processes, as in some containers)."""

    index: int
    name: str | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    utilization_percent: float | None
    temperature_c: float | None
    power_w: float | None
    power_limit_w: float | None
    sm_clock_mhz: float | None
    this_run_memory_bytes: int | None


@dataclass(frozen=True)
class AllocatorSample(JsonObject):
    """The CUDA caching allocator on the trainer's device: None throughout on a CPU run. The peak is since its
    last reset, which the trainer does at each option change."""

    device: str
    allocated_bytes: int | None
    reserved_bytes: int | None
    peak_allocated_bytes: int | None


#: How ``TelemetrySample.gpu_status`` begins on a box without a GPU the trainer can read: "no GPU: <why>".
NO_GPU = "no GPU"


def no_gpu_status(why: str) -> str:
    """The ``gpu_status`` of a sample without GPUs."""
    return f"{NO_GPU}: {why}"


def why_no_gpu(status: str) -> str:
    """The reason in a ``gpu_status`` made by ``no_gpu_status``, or the status as it is."""
    prefix = f"{NO_GPU}: "
    return status[len(prefix):] if status.startswith(prefix) else status


@dataclass(frozen=True)
class TelemetrySample(JsonObject):
    """One system sample, about once a second: the host, the GPUs (empty, with ``gpu_status`` saying why, on a
    box without NVIDIA), and the allocator (``torch``, as in ``system.jsonl``)."""

    time: float
    step: int
    host: HostSample
    gpus: list[GpuSample]
    gpu_status: str
    torch: AllocatorSample

    @property
    def run_gpu_memory_bytes(self) -> int | None:
        """What NVML sees of this run: the memory it attributes to the run's processes, every GPU together (the
        caching allocator's reserve, CUDA's context and workspaces included). None, never 0, where nothing says:
        no NVML (a CPU box), or GPUs that list no processes (as in some containers)."""
        seen = [gpu.this_run_memory_bytes for gpu in self.gpus if gpu.this_run_memory_bytes is not None]
        return sum(seen) if seen else None


# ----------------------------------------------------------------------------- Memory: by kind, measured


@dataclass(frozen=True)
class ModuleBytes(JsonObject):
    """The activation bytes saved for backward while ``module`` was the innermost module running (its own
    ops, not its children's); ``(root)`` the model's own code, ``(loss_fn)`` the workload's code outside it."""

    module: str
    bytes: int


#: A step's phases, in the order it runs them (``StepPhases``); ``other`` is what none of them took.
PHASES = ("data", "copy", "forward", "backward", "optimizer", "communication", "probes", "other")


@dataclass(frozen=True)
class StepPhases(JsonObject):
    """Where a step's time went, in seconds (core/engine/measure/step_phases.py), adding up to its time: each the
    mean over the ``steps`` timed since the row before that had them (a row of the probe's carries them), a
    compile's steps left out:
    waiting for the loader (``data_s``), the batch's copy to the device (``copy_s``), forward and backward (the
    loss's own code with them), the optimizer's step with zero_grad and the schedule, the engine's own collectives
    (``communication_s``: the loss's mean over ranks; DDP's and FSDP2's overlap backward and forward, whose time their
    exposed part is counted in), the probes' own work on this step (``probes_s``: the gradient norms, the update
    probe's copy; the phases are measured on the probe's steps, and a step it does not measure takes none), and
    ``other_s``: what none of them took (the host's bookkeeping, the step's transfer). ``clock``: what timed them
    ("host": on a CPU, where each op runs as it is called; "stream": on CUDA, events on the stream, each phase the
    device's time from its start to its end, the device's wait for the host within it included)."""

    data_s: float
    copy_s: float
    forward_s: float
    backward_s: float
    optimizer_s: float
    communication_s: float
    probes_s: float
    other_s: float
    steps: int = 1
    clock: str = "host"
    #: a step's model FLOPs (core/engine/measure/flops.py: checkpointing's recompute left out), the mean over those of
    #: the steps whose kind was counted; the
    #: FLOP/s they achieved (over their time less the probes'); the device's peak for their dtype; the ops a step
    #: dispatched, each with its fixed cost on the host. None: not counted
    flops: float | None = None
    flops_per_s: float | None = None
    peak_flops_per_s: float | None = None
    ops: float | None = None

    def seconds(self) -> dict[str, float]:
        """Each phase's seconds, by its name in ``PHASES``."""
        return {phase: getattr(self, f"{phase}_s") for phase in PHASES}

    @property
    def mfu(self) -> float | None:
        """The share of the device's peak FLOP/s the steps achieved (model FLOPs utilisation), where both are known."""
        if self.flops_per_s is None or not self.peak_flops_per_s:
            return None
        return self.flops_per_s / self.peak_flops_per_s


@dataclass(frozen=True)
class ModuleFlops(JsonObject):
    """A counted step's FLOPs charged to ``module`` (core/engine/measure/module_flops.py): its own ops', not its
    children's, in forward, in backward, and run again in backward by activation checkpointing (``recompute``);
    ``(root)`` the model's own code, ``(loss_fn)`` the workload's code outside the model."""

    module: str
    forward: int
    backward: int
    recompute: int = 0

    @property
    def total(self) -> int:
        return self.forward + self.backward + self.recompute


@dataclass(frozen=True)
class OpFlops(JsonObject):
    """A counted step's FLOPs in one op, named as the profiler names it (``aten::mm``): a profile's time of the op
    gives the FLOP/s it reached."""

    op: str
    flops: int


@dataclass(frozen=True)
class MemoryBreakdown(JsonObject):
    """The bytes training holds in tensors at ``step``, by kind, measured on that step (core/engine/measure/memory.py):
    the same on CPU as on CUDA, unlike the process RSS, which only grows. ``activations_bytes`` are the tensors
    autograd saved for backward in one micro-batch's forward, each storage once; ``by_module`` splits them,
    largest first. ``allocator_peak_bytes``: on CUDA, the caching allocator's peak since the segment began
    (None on a CPU)."""

    step: int
    parameters_bytes: int  # parameters and buffers
    gradients_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    allocator_peak_bytes: int | None
    by_module: list[ModuleBytes]
    #: sharded (parallel=fsdp): parameters gathered whole that forward saved for backward, as much as is held at once
    gathered_bytes: int = 0
    #: measured on a batch as long as the longest the run has taken (core/engine/measure/longest_batch.py): on a CPU the
    #: step's first batch, whose forward's saved tensors are counted; on CUDA one taken since the allocator's peak was
    #: reset. Only such figures check a prediction, which is made with the longest batch.
    longest_batch: bool = True

    @property
    def total_bytes(self) -> int:
        """The kinds added up: at most what the tensors of training hold at once (in backward, gradients are made as
        activations are freed)."""
        return (self.parameters_bytes + self.gradients_bytes + self.optimizer_bytes + self.activations_bytes
                + self.gathered_bytes)


#: Said beside every prediction (``torchlab-tui plan``, the app's "what fits"): what the figures leave out.
NOT_MODELLED = ("not modelled: the allocator's cache and fragmentation, cuDNN/cuBLAS workspaces, NCCL's buffers and "
                "the CUDA context; a compiled model predicted as it runs eagerly")
#: Said beside a prediction made with the dataset's first samples (``plan``; a live run before its first step).
FIRST_BATCH = "the batch is the dataset's first samples (with batches of varying length, a longer one takes more)"


@dataclass(frozen=True)
class MemoryPrediction(JsonObject):
    """A step's memory predicted on fake tensors before it is paid for (core/engine/forecast/memory_forecast.py), per
    rank: ``settings`` are what it is predicted for (amp, checkpointing, split, accum, batch_size, world_size,
    parallel). ``peak_bytes`` is the most the step's tensors hold at once, what CUDA's ``max_memory_allocated`` would
    read, and ``at_peak`` what it is made of then, by kind (parameters, gradients, optimizer, activations, gathered,
    other: backward's temporaries, FSDP2's communication buffers, DDP's gradient buckets), adding up to it. The kinds'
    own fields are each one's most over the step, as ``MemoryBreakdown`` measures them (gradients are all there after
    backward, when most activations are gone): their sum is comparable with its ``total_bytes``, not with the peak.
    ``refused``: why these settings cannot run here (amp=fp16 under FSDP2), the figures then 0. ``plan --json``
    writes it as the object of its fields; a live run's ``memory_predicted`` carries it."""

    settings: dict[str, Any]
    peak_bytes: int
    at_peak: dict[str, int]
    parameters_bytes: int  # parameters and buffers (this rank's shards under FSDP2)
    gradients_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    gathered_bytes: int  # FSDP2: parameters gathered whole
    seconds: float  # what the prediction took
    refused: str | None = None

    @property
    def weights_at_peak(self) -> int:
        """Of the peak, what the weights hold: parameters, gradients and optimizer state (``plan``'s column, the app's)."""
        return sum(self.at_peak.get(kind, 0) for kind in ("parameters", "gradients", "optimizer"))

    @property
    def other_at_peak(self) -> int:
        """Of the peak, neither weights nor activations: parameters FSDP2 gathered whole, temporaries, buffers."""
        return self.at_peak.get("gathered", 0) + self.at_peak.get("other", 0)

    @property
    def total_bytes(self) -> int:
        """The kinds' own most added up: what ``MemoryBreakdown.total_bytes`` measures of the same step."""
        return (self.parameters_bytes + self.gradients_bytes + self.optimizer_bytes + self.activations_bytes
                + self.gathered_bytes)


# ----------------------------------------------------------------------------- Trials: one option, two arms


@dataclass(frozen=True)
class TrialArm(JsonObject):
    """One arm of a controlled trial: ``steps`` steps from the same state on the same batches, with the options
    ``label`` says ("as it is", or the change: "amp=bf16"). Step time as the impact table gives it (median and
    90 % interval, None under ten timed steps), the memory a step of it measured, and the loss of each step.
    ``error`` says why the arm could not run (fp16 on a CPU, out of memory); its figures are then None/empty."""

    label: str
    steps: int  # the steps it ran (fewer than asked when it failed part way)
    median_step_time_s: float | None
    step_time_low_s: float | None
    step_time_high_s: float | None
    activations_bytes: int | None
    tensor_bytes: int | None
    losses: list[float]
    error: str | None
    #: what other processes took of the machine's CPU while the arm ran (0-100; None where unknown): where it moved
    #: between the arms by ``LOAD_SHIFT_POINTS``, their speeds are not compared
    others_cpu_percent: float | None = None


@dataclass(frozen=True)
class TrialSpeed(JsonObject):
    """A trial's speed verdict (core/analysis/trial_speed.py): ``ratio`` is the changed arm's step time over the arm
    as it is (1.7: 70 % slower), from the pairs of blocks its interleaved arms ran on the same batches; ``low`` and
    ``high`` its 90 % interval; ``verdict`` "slower", "faster" or "no clear difference" (a direction only where the
    whole interval lies beyond the practical margin, 0.97-1.03x); ``pairs`` how many pairs of blocks it rests on;
    ``steps`` how many steps each arm ran to time it: the trial's K, or more where K's pairs left the interval wide;
    ``per_sample`` where the arms' steps train different numbers of samples (a trial of ``accum``): the ratio is of
    a sample's time, not a step's."""

    ratio: float
    low: float
    high: float
    verdict: str
    pairs: int
    steps: int
    per_sample: bool = False


# ----------------------------------------------------------------------------- Ranks: per-rank figures


@dataclass(frozen=True)
class RankFigures(JsonObject):
    """One rank's figures on a report step: its step time, its wait for batches, the CUDA allocator's memory
    (None on a CPU rank) and its RSS; and where its steps' time went since the figures before (each a mean over the
    steps its phase clock timed: core/engine/measure/step_phases.py): the batch's copy, forward, backward (DDP's wait
    for the other ranks' gradients in it), optimizer, the engine's own collectives; and its machine's CPU and memory.
    None where the rank could not measure a figure (a phase where no step was timed)."""

    rank: int
    step_time_s: float | None
    data_wait_s: float | None
    allocated_bytes: float | None
    reserved_bytes: float | None
    peak_allocated_bytes: float | None
    rss_bytes: float | None
    copy_s: float | None = None
    forward_s: float | None = None
    backward_s: float | None = None
    optimizer_s: float | None = None
    communication_s: float | None = None
    #: the rank's machine: its CPU's busy share since the figures before (0-100, of all its cores) and its available
    #: memory: each node's host telemetry where the ranks span several
    host_cpu_percent: float | None = None
    host_available_bytes: float | None = None


# ----------------------------------------------------------------------------- Impact: the table's rows


@dataclass(frozen=True)
class ImpactSegment(JsonObject):
    """The steps between two option changes, summarised (one row of ``impact.json``, in its key order).

    Medians leave out the first steps after a change. Memory is measured on the tensors (``MemoryBreakdown``;
    None until a memory step came): ``activations_bytes`` and ``tensor_bytes``; ``peak_allocated_bytes`` is the
    CUDA allocator's peak (None on a CPU), and the memory a segment is judged by where there is one, else
    ``tensor_bytes``. ``others_cpu_percent``: the median share of the machine's CPU that other processes took
    beside the segment's timed steps (each step counted with the newest telemetry before it, so a trial's or a
    pause's seconds weigh nothing); where it moved by ``LOAD_SHIFT_POINTS`` from the segment before, a speed difference is not
    judged (``speed not judged: other processes' CPU use went 5 % → 60 %``). ``nvml_run_bytes`` is what NVML sees of the run (``TelemetrySample.run_gpu_memory_bytes``),
    the most of the segment's samples: shown, not judged, as the allocator's cache only grows (None on a CPU). The loss slope is per 100 steps (None under three losses). ``speedup``,
    ``memory_change`` and ``activations_change`` compare with the segment that begins at ``baseline_step``: the
    nearest before it with enough timed steps to judge, so a segment too short is skipped over (None for the first,
    or where a figure is missing; an ``impact.json`` from before the field compared with the segment just before);
    ``verdict`` says it in words: ``amp=bf16: 1.72x faster, activations -45 %, memory -38 %``, ending ``(vs clip=1.0
    at step 21, changed since: amp=bf16, accum=2)`` where its baseline is not the segment just before, and
    ``workers=2: 1.31x faster, data wait 4.2 → 0.1 ms`` where the data wait moved by 5 % of a step or more.

    ``step_time_low_s`` to ``step_time_high_s`` is a 90 % interval of the median step time (None under ten
    timed steps; ``core/analysis/impact.py`` says how it is built). Speed is judged only where the two segments'
    intervals do not overlap: elsewhere ``speedup`` is None and the verdict says ``no clear difference (±6 %, segments
    ran in turn, ...)``, or from ±100 % on ``no clear difference (step times varied up to 3.3x, ...)``.
    """

    change: str  # "start", or the options that changed: "amp=bf16, accum=2"
    options: dict[str, Any]  # every live option's value in this segment
    first_step: int
    last_step: int
    median_step_time_s: float | None
    step_time_low_s: float | None
    step_time_high_s: float | None
    median_samples_per_s: float | None
    median_data_wait_s: float | None  # of a step, waiting for its batches (the loader's own time with 0 workers)
    peak_allocated_bytes: int | None
    nvml_run_bytes: int | None  # the most NVML attributed to the run in the segment's telemetry (CUDA; else None)
    others_cpu_percent: float | None  # the median share of the machine's CPU other processes took beside the timed steps (None: no telemetry)
    activations_bytes: int | None  # saved for backward, the most a memory step of the segment measured
    tensor_bytes: int | None  # parameters + gradients + optimizer state + activations, likewise
    loss_slope_per_100_steps: float | None
    speedup: float | None  # the baseline's median over this one: 2.0 is twice as fast
    memory_change: float | None  # a fraction: -0.38 is 38 % less
    activations_change: float | None  # likewise, of ``activations_bytes``
    verdict: str
    baseline_step: int | None = None  # the first step of the segment it is compared with (None: the first segment)
    #: what the forecast predicted of the figure its memory is (the allocator's peak on CUDA, else the tensors'
    #: total), and the measured over it less 1: None where these settings were not predicted (the app's "what fits")
    predicted_bytes: int | None = None
    prediction_error: float | None = None
