"""What a trainer reports that only its observers see: the run's journal (``events.jsonl``), the progress
line of a headless run, the impact tracker, the supervisor of its ranks.

The trainer emits typed events and nothing else. Those the app receives as they are (an option applied
or refused, a checkpoint, an error, a non-finite stop, a profile) are the protocol's own messages
(core/wire/protocol.py); of the ones here, the app's reporter turns the run's changes of state into a ``State``
and the ``Welcome``, and sends the app those a person reads as a sentence as they are. Both kinds are messages
of one protocol: rank 0 sends them to its supervisor as their protocol text, and ``Message.journal_record`` is
their line in the journal. ``describe`` makes an event's sentence, the one place it is made: the app's event
log and a headless run's output say the same words.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from torchlab.core.options import SPIKE_GUARD, format_option_value
from torchlab.core.units import format_bytes
from torchlab.core.wire.protocol import (
    CheckpointSaved, Error, Log, LogLevel, Message, NonFinite, OptionApplied, OptionRefused, ProfileReady, TrialProgress,
    TrialResult,
)
from torchlab.core.wire.compile_report import CompileReport, compile_sentence
from torchlab.core.wire.hang import Hang, hang_sentence
from torchlab.core.wire.straggler import Straggler, straggler_sentence
from torchlab.core.wire.payloads import MemoryPrediction, ModuleFlops, OpFlops
from torchlab.core.wire.typed_json import JsonScalar


@dataclass(frozen=True)
class RunStarted(Message):
    """The trainer (or rank 0) is ready and trains from ``step``: the run as the app's Welcome describes it."""

    type: ClassVar[str] = "run_started"
    step: int
    device: str
    batch_size: int
    steps: int
    options: dict
    modules: list  # module names, in the order of per-module figures
    module_params: list  # parameters per module, aligned with ``modules``
    checkpoint_blocks: list
    world_size: int
    ranks: list | None  # each rank's host and pid, with ranks; null without
    #: per module, aligned with ``modules``: the other modules holding some of its (tied) parameters
    module_tied: list = field(default_factory=list)
    #: the workload's own optimizer and scheduler (core/records/config.py FromWorkload.as_dict), for config.toml; None: neither
    from_workload: dict | None = None
    #: the workload's own starting values the run took, by name (core/records/starting_values.py with_workload_settings), for
    #: config.toml; None: none
    workload_settings: dict | None = None
    #: the model's BatchNorm layers, which a split of the batch changes besides memory (the OOM rescue's note)
    batch_norm_layers: int = 0


@dataclass(frozen=True)
class RunEnded(Message):
    """The loop ended without an error: ``finished`` (every step) or ``stopped`` (on request)."""

    type: ClassVar[str] = "run_ended"
    step: int
    status: str


@dataclass(frozen=True)
class Paused(Message):
    type: ClassVar[str] = "paused"
    step: int


@dataclass(frozen=True)
class Resumed(Message):
    """Training goes on after a pause, from ``step``."""

    type: ClassVar[str] = "resumed"
    step: int


@dataclass(frozen=True)
class StepSkipped(Message):
    """fp16's scaler found Inf/NaN gradients and skipped the optimizer step (and lowered its scale)."""

    type: ClassVar[str] = "step_skipped"
    step: int
    reason: str
    scale: float | None = None


@dataclass(frozen=True)
class OomRescued(Message):
    """Step ``step`` ran out of memory (``error``, its first line) and is retried with ``option`` = ``value`` (was
    ``previous``), which stays in force: the OOM rescue's rung (core/engine/guards/oom_rescue.py); ``note``, what else it
    means, or empty. ``samples_before``/``samples_after``: the most samples one forward took before the rung and with
    it (a micro-batch's largest piece; with ranks, a rank's), None where the batch cannot be counted."""

    type: ClassVar[str] = "oom_rescued"
    step: int
    option: str
    value: JsonScalar
    previous: JsonScalar
    error: str
    #: what else the user should know of the rung: its BatchNorm now sees each piece's statistics, or why the batch
    #: was not split
    note: str = ""
    samples_before: int | None = None
    samples_after: int | None = None


#: What the spike guard does with a spike (``SpikeGuarded.action``, a metrics row's ``spike``): the first two hold
#: the step's update back.
SKIPPED, ROLLED_BACK, LET_THROUGH, NEW_LEVEL = "skipped", "rolled_back", "let_through", "new_level"
HELD_BACK = frozenset({SKIPPED, ROLLED_BACK})


@dataclass(frozen=True)
class SpikeGuarded(Message):
    """Step ``step``'s ``measure`` (``loss`` or ``grad_norm``) was ``value``, ``z`` robust deviations above the
    ``median`` of the last ``window`` steps, past the spike guard's ``threshold`` (core/engine/guards/spike_guard.py); null
    where not finite. ``action``: ``skipped`` (its update held back), ``rolled_back`` (to the state after step
    ``rolled_back_to``), ``let_through`` (the guard off: applied) or ``new_level`` (spikes in a row: taken as the
    run's new level, applied). ``samples``: the dataset indices of the step's batches, where it has indices.
    ``held_back``: with the guard off, the spikes let through since the last notice whose notices were not sent
    (each is marked in its metrics row): its notices are sent at most once a minute after the run's first."""

    type: ClassVar[str] = "spike_guarded"
    step: int
    measure: str
    value: float | None
    median: float | None
    z: float | None
    threshold: float
    window: int
    action: str
    loss: float | None = None
    grad_norm: float | None = None
    rolled_back_to: int | None = None
    note: str = ""
    #: the dataset indices of the step's samples (at most ``MAX_SPIKE_SAMPLES``), where the dataset has indices
    samples: list | None = None
    held_back: int = 0


#: The most dataset indices a spike_guarded event lists.
MAX_SPIKE_SAMPLES = 1024


@dataclass(frozen=True)
class ProfileStarted(Message):
    """A profiler snapshot records ``steps`` steps after ``warmup`` from ``step``."""

    type: ClassVar[str] = "profile_started"
    step: int
    steps: int
    warmup: int = 1
    source: str = ""


@dataclass(frozen=True)
class TrialStarted(Message):
    """A controlled trial of ``option`` = ``value`` runs two arms of ``steps`` steps from ``step``'s boundary;
    a TrialResult follows."""

    type: ClassVar[str] = "trial_started"
    step: int
    option: str
    value: JsonScalar
    steps: int
    source: str = ""


#: The running state's detail from a CompileStarted until the answer to the change it compiles for: the app's
#: header says it where it said "running" through a 70 s compile.
COMPILING = "compiling…"


@dataclass(frozen=True)
class CompileStarted(Message):
    """torch.compile compiles the model at ``step``'s boundary (``detail``: what for, "with amp=bf16", or empty);
    training waits for it. The option_applied or option_refused of the change that asked for it follows."""

    type: ClassVar[str] = "compile_started"
    step: int
    detail: str = ""


@dataclass(frozen=True)
class ResumedFromCheckpoint(Message):
    """This process continues a run from its checkpoint of ``step``, with ``options`` in force."""

    type: ClassVar[str] = "resumed_from_checkpoint"
    step: int
    options: dict = field(default_factory=dict)


@dataclass(frozen=True)
class ResumeChangedSettings(Message):
    """A resume ran with settings other than the checkpoint's: which, and whether the run stays exact."""

    type: ClassVar[str] = "resume_changed_settings"
    step: int
    level: str
    message: str
    changes: list = field(default_factory=list)


@dataclass(frozen=True)
class Relaunching(Message):
    """The supervisor stops the ranks and starts ``world_size`` new ones from the checkpoint of ``step``, for a change
    of ``option`` (one of ``RELAUNCHED_BY``) from ``previous`` to ``value``."""

    type: ClassVar[str] = "relaunching"
    step: int
    option: str
    value: JsonScalar
    previous: JsonScalar
    world_size: int

    @property
    def change(self) -> str:
        """The change in a few characters, for the app's header: "1 → 2", "ddp → fsdp"."""
        return f"{self.previous} → {self.value}"


@dataclass(frozen=True)
class LineRefused(Message):
    """A line refused on ``channel`` (the app's socket, the rank channel), and why; ``held_back`` lines were
    not journalled before it (at most a burst a minute is: core/wire/throttle.py)."""

    type: ClassVar[str] = "line_refused"
    step: int
    channel: str
    reason: str
    before_hello: bool = False
    refused_by: str = ""  # which side refused it, on the rank channel
    held_back: int = 0


@dataclass(frozen=True)
class LinesRefusedUnrecorded(Message):
    """When the journal closes: ``count`` refused lines that the throttle held back and never wrote."""

    type: ClassVar[str] = "lines_refused_unrecorded"
    step: int
    channel: str
    count: int



@dataclass(frozen=True)
class JournalRepaired(Message):
    """A journal of the run ended in a torn line (a write cut short): its last ``bytes_dropped`` bytes went."""

    type: ClassVar[str] = "journal_repaired"
    step: int
    file: str
    bytes_dropped: int
    message: str


@dataclass(frozen=True)
class MetricsMovedAside(Message):
    """A resume trains steps ``first_step``..``last_step`` again: their ``rows`` of metrics.jsonl went to ``file``."""

    type: ClassVar[str] = "metrics_moved_aside"
    step: int
    rows: int
    first_step: int
    last_step: int
    file: str
    message: str


@dataclass(frozen=True)
class StopRequested(Message):
    """A stop was asked for: by a client of the run's socket, ``reason`` saying who (the app, ``torchlab-tui stop``) in
    the trainer process's words (core/launch/worker.py), never in the client's; or by a signal to a rank, a scheduler's
    warning, which every rank takes at the same boundary (core/engine/parallel/preemption.py: "SIGTERM to rank 1: ...")."""

    type: ClassVar[str] = "stop_requested"
    step: int
    reason: str


@dataclass(frozen=True)
class MemoryPredicted(Message):
    """A step's memory under ``settings`` (amp, checkpointing, split, accum, batch_size, world_size, parallel),
    predicted on fake tensors by the run's forecaster process (core/engine/forecast/forecaster.py) at a
    ``ForecastCommand``, and again around each change of the settings in force. ``change``: those settings as the
    change that makes them from the ones in force when they were asked (``in force`` for these). ``capacity_bytes``
    is what one rank has to fit in under them (a GPU's own memory, or its share of a CPU's RAM; ``capacity`` says
    where the figure comes from), ``verdict`` yes (under 90 % of it), tight or no; ``prediction`` None and ``error`` why where the step could not be predicted (an op that needs
    the data). ``ratio``: measured over predicted on this run so far (the ``prediction_checked`` records), by which
    ``corrected_peak_bytes`` is the peak to expect, and the verdict is of it; None until a setting was measured."""

    type: ClassVar[str] = "memory_predicted"
    step: int
    settings: dict
    change: str
    prediction: MemoryPrediction | None
    capacity_bytes: int
    capacity: str
    verdict: str = ""
    error: str = ""
    ratio: float | None = None
    #: the elements of the run's longest batch (``longest_batch``) it was predicted with, its shapes stretched to the
    #: batch size predicted; None: with the dataset's first samples (asked before the run's first step)
    longest_batch_elements: int | None = None

    @property
    def corrected_peak_bytes(self) -> int | None:
        if self.prediction is None or self.prediction.refused is not None:
            return None
        return round(self.prediction.peak_bytes * (self.ratio or 1.0))


@dataclass(frozen=True)
class LongestBatch(Message):
    """The longest batch the run has taken grew (core/engine/measure/longest_batch.py): the one whose tensors hold the
    most elements, ``elements``, of ``shapes`` (each tensor's, in the batch's order; a rank's batch). With batches of
    varying length the longest is the one that must fit: the run's forecaster predicts with it, stretched to each batch
    size it predicts. ``previous_elements``: the longest before it (0: this is the first batch the run took, or the one
    a resumed run's checkpoint knew). Rank 0's batches: the other ranks take batches of the same distribution."""

    type: ClassVar[str] = "longest_batch"
    step: int
    shapes: list
    elements: int
    previous_elements: int = 0


@dataclass(frozen=True)
class FlopsCounted(Message):
    """A kind of training step's FLOPs were counted, on step ``step`` (core/engine/measure/flops.py): the model's
    ``flops`` a step (what its MFU is of) and, besides, the forward FLOPs activation checkpointing ran again
    (``recomputed``), ``ops`` dispatched, of the kind its first batch's tensors' ``shapes`` and the ``settings`` that
    change its work (checkpointing, split, accum) make; where they are, by module (``by_module``, largest first:
    where each op ran, core/engine/measure/module_flops.py) and by op (``by_op``, largest first), each with the
    recompute in it."""

    type: ClassVar[str] = "flops_counted"
    step: int
    flops: int
    ops: int
    shapes: list
    settings: dict
    by_module: list[ModuleFlops]
    by_op: list[OpFlops]
    recomputed: int = 0


#: ``PredictionChecked.measure``: which measured figure a prediction is checked against.
ALLOCATOR_PEAK = "allocator_peak"
TENSORS = "tensors"


@dataclass(frozen=True)
class PredictionChecked(Message):
    """A setting's predicted memory against what the run measured once it trained with it (core/engine/forecast/
    forecaster.py): ``measure`` says which figure, the CUDA allocator's peak (``max_memory_allocated``, against the
    predicted peak) or, on a CPU, the tensors training holds (the memory view's total by kind, against the predicted
    kinds'); ``error`` is measured over predicted less 1. ``ratio``: measured over predicted on this run so far (the
    median of its checks), which corrects the predictions made from now on. The journal's ``prediction`` record."""

    type: ClassVar[str] = "prediction_checked"
    journal_name: ClassVar[str] = "prediction"
    step: int
    settings: dict
    measure: str
    predicted_bytes: int
    measured_bytes: int
    error: float
    ratio: float


#: Every event a trainer, its supervisor or its journal's writers emit: the ones above, and the protocol's
#: messages the app receives as they are.
TRAINER_EVENTS = (
    RunStarted, RunEnded, Paused, Resumed, StepSkipped, OomRescued, SpikeGuarded, ProfileStarted, TrialStarted, CompileStarted, ResumedFromCheckpoint,
    ResumeChangedSettings, Relaunching, LineRefused, LinesRefusedUnrecorded, JournalRepaired, MetricsMovedAside,
    StopRequested, MemoryPredicted, PredictionChecked, LongestBatch, FlopsCounted, CompileReport, Straggler, Hang, OptionApplied,
    OptionRefused, CheckpointSaved, Error, NonFinite, ProfileReady, TrialResult, TrialProgress,
)


@dataclass(frozen=True)
class Sentence:
    """An event as a person reads it; ``warning``: said as one (the app's log marks it, headless writes "warning:")."""

    text: str
    warning: bool = False


def _checked_prediction(event: PredictionChecked) -> str:
    figure = "the allocator's peak" if event.measure == ALLOCATOR_PEAK else "the tensors' total"
    scaled = f"; predictions scaled by this run's {event.ratio:.3f} from now on" if abs(event.ratio - 1) >= 0.0005 else ""
    return (f"memory of the settings in force: {figure} {format_bytes(event.measured_bytes)} measured, "
            f"{format_bytes(event.predicted_bytes)} predicted ({event.error * 100:+.1f} %){scaled}")


def describe(event: Message) -> Sentence | None:
    """The sentence for ``event``, or None where what it says is a state, a figure or a table that the app and
    headless each show their own way."""
    match event:
        case TrialStarted():
            value = format_option_value(event.option, event.value)
            return Sentence(f"trying {event.option} = {value} for {event.steps} steps against as many as it is")
        case CompileStarted():
            return Sentence(f"compiling the model{' ' + event.detail if event.detail else ''} (torch.compile): training waits for it")
        case StepSkipped():
            return Sentence(f"step skipped: {event.reason}", warning=True)
        case OomRescued():
            value, previous = (format_option_value(event.option, v) for v in (event.value, event.previous))
            note = f"; {event.note}" if event.note else ""
            samples = (f"; {event.samples_after} samples a forward, not {event.samples_before}"
                       if event.samples_after is not None and event.samples_after != event.samples_before else "")
            return Sentence(f"step {event.step} ran out of memory ({event.error}): retried with {event.option} = {value} "
                            f"(was {previous}), in force from now on{samples}{note}", warning=True)
        case SpikeGuarded():
            return Sentence(_spike_sentence(event), warning=True)
        case ProfileStarted():
            return Sentence(f"profiling {event.steps} steps after {event.warmup} warm-up")
        case ResumedFromCheckpoint():
            return Sentence(f"resumed from the checkpoint of step {event.step}")
        case ResumeChangedSettings():
            return Sentence(event.message, warning=event.level == LogLevel.WARNING)
        case Paused() | Resumed():
            return Sentence(event.type)  # "paused", "resumed"
        case Relaunching():
            if event.option == "world_size":
                return Sentence(f"relaunching with {event.world_size} rank(s) (was {event.previous})")
            return Sentence(f"relaunching the {event.world_size} rank(s) with {event.option}={event.value} "
                            f"(was {event.previous})")
        case Log():
            return Sentence(event.text, warning=event.level == LogLevel.WARNING)
        case StopRequested():
            return Sentence(f"{event.reason} (at the end of this step, with a final checkpoint)")
        case PredictionChecked():
            return Sentence(_checked_prediction(event), warning=abs(event.error) > 0.1)
        case LongestBatch() if event.previous_elements:
            return Sentence(_longer_batch(event))
        case Straggler():
            return Sentence(straggler_sentence(event), warning=not event.cleared)
        case Hang():
            return Sentence(hang_sentence(event), warning=True)
        case CompileReport():
            return Sentence(compile_sentence(event), warning=bool(event.breaks or event.recompiles))
        case _:
            return None


def _longer_batch(event: LongestBatch) -> str:
    return (f"a longer batch than any before: {shapes_in_words(event.shapes)} "
            f"({(event.elements / event.previous_elements - 1) * 100:+.0f} % elements): what fits predicts with it from now on")


def shapes_in_words(shapes: list) -> str:
    """A batch's tensors' shapes: ``32×512, 32×512, 32``; a batch of many tensors by its first four."""
    words = ["×".join(str(size) for size in shape) or "scalar" for shape in shapes[:4]]
    return ", ".join(words) + (f" and {len(shapes) - 4} more" if len(shapes) > 4 else "")


def _spike_sentence(event: SpikeGuarded) -> str:
    measure = "grad norm" if event.measure == "grad_norm" else event.measure
    if event.value is None or event.z is None or event.median is None:
        how_far = f"{measure} not finite"
    else:
        factor = (f"{event.value / event.median:.3g} times the median {event.median:.4g} of the last {event.window} "
                  f"steps, {event.z:.3g} robust deviations" if event.value > 0 and event.median > 0 else
                  f"{event.z:.3g} robust deviations above the median {event.median:.4g} of the last {event.window} steps")
        how_far = f"{measure} {event.value:.4g}, {factor} (threshold {event.threshold:g})"
    match event.action:
        case "skipped":
            what = "its update held back, training goes on with the next batch"
        case "rolled_back" if event.rolled_back_to is not None:
            what = (f"rolled back to the weights and optimizer of step {event.rolled_back_to}: steps "
                    f"{event.rolled_back_to + 1}-{event.step} undone, their batches not trained on again")
        case "let_through":
            what = (f"applied: the spike guard is off (key {SPIKE_GUARD.key} or {SPIKE_GUARD.flag} skip holds such a "
                    f"step's update back)")
        case _:
            what = "taken as the run's new level after spikes in a row, not a spike: applied, the window starts again"
    note = f" ({event.note})" if event.note else ""
    held_back = (f"; {event.held_back} more since the last notice, each marked in its metrics row"
                 if event.held_back else "")
    return f"spike at step {event.step}: {how_far}: {what}{note}{held_back}"
