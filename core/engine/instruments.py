"""What a step measures besides training, and when: the step's instruments, behind two calls of the loop.

``Instruments.plan`` decides before a step what it measures (``StepPlan``): per-module gradient norms when the
probe's cadence says so (core/engine/measure/probes.py), activation statistics every ``--act-stats-every`` report steps,
memory by kind when its cadence says so (core/engine/measure/memory.py), and whether the step reports at all. With
ranks, rank 0's decisions for the next step (``NextStep``) are shared at the boundary, so every rank takes part
in the same collectives. ``Instruments.watch`` measures one step (``StepWatch``): its clock, the hooks of a
sampled step, the gradients' norms and bytes, torch.compile's graphs compiled during it, and its one host
transfer; ``StepWatch.finish`` gives the step's ``StepReport``.

A trial's steps are planned by the trial (core/engine/trials.py): they measure memory once, report nothing,
and teach the cadences nothing.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ContextManager

import torch

from torchlab.core.engine.compiling import compiled_graphs
from torchlab.core.engine.measure.memory import MemoryCadence, MemoryProbe, SavedTensorCount, out_of_memory
from torchlab.core.engine.parts import TrainingParts
from torchlab.core.engine.measure.profiler import Profiling
from torchlab.core.engine.measure.probes import ActivationStatsProbe, GradNormProbe, GradNorms, ProbeCadence
from torchlab.core.engine.measure.step_report import HostTransfer, HostValues, StepReport, Update, stats_by_module
from torchlab.core.engine.measure.device_peaks import TERA
from torchlab.core.engine.measure.flops import Counted, StepFlops, flops_counted, step_kind
from torchlab.core.engine.measure.step_phases import TIMED_DEVICES, PhaseTotals, marks_of
from torchlab.core.engine.measure.update_probe import UpdateFigures, UpdateProbe
from torchlab.core.wire import protocol as p
from torchlab.core.wire.payloads import MemoryBreakdown, StepPhases
from torchlab.core.units import format_bytes

_NOTHING = contextlib.nullcontext()


@dataclass(frozen=True, slots=True)
class StepPlan:
    """What one step measures besides training, and how it treats a failure, decided before it starts.

    ``report``: its figures go to a metrics row; ``activations``: activation statistics (hooks on this step
    only; a compiled model runs uncompiled for it, since hooks added to a compiled model do not fire);
    ``memory``: memory by kind (the first micro-batch's forward counted); ``probe``: per-module gradient norms.

    What a trial arm's step does otherwise (``StepPlan.trial``): ``training``: training's own step, whose figures
    teach the cadences and the update probe, which sends the row held for them, and whose NaN stops the run (an
    arm's NaN loss ends the arm); ``guarded``: the spike guard judges it; ``retries``: a step that runs out of memory
    is tried again one rung down (in training, in one process: with ranks, the others wait in its collectives)."""

    report: bool = False
    activations: bool = False
    memory: bool = False
    probe: bool = False
    training: bool = True
    guarded: bool = True
    retries: bool = True

    @classmethod
    def trial(cls, memory: bool) -> StepPlan:
        """A trial arm's step: it reports nothing, measures memory where asked, and teaches training nothing."""
        return cls(memory=memory, training=False, guarded=False, retries=False)


#: Training's plans, by (report, activations, memory, probe, retries): made once, not each step.
_PLANS = {(report, activations, memory, probe, retries): StepPlan(report, activations, memory, probe, retries=retries)
          for report in (False, True) for activations in (False, True) for memory in (False, True)
          for probe in (False, True) for retries in (False, True)}


@dataclass
class NextStep:
    """Rank 0's decisions for the next step, shared with every rank at the boundary (core/engine/commands.py):
    whether it measures gradient norms, whether its report gathers each rank's figures, and whether a periodic
    checkpoint follows it. Every rank then takes part in the same collectives at the same step."""

    probe: bool = False
    figures: bool = False
    checkpoint: bool = False


class Instruments:
    """The probes of one run and their cadences (see the module docstring)."""

    def __init__(self, parts: TrainingParts, profiling: Profiling) -> None:
        self.parts, self.profiling = parts, profiling
        model = parts.model.model
        self.grad_probe = GradNormProbe(model)
        self.cadence = ProbeCadence(parts.config.probe_every)
        self.activation_probe = ActivationStatsProbe(model, self.grad_probe.module_names)
        self.memory_probe = MemoryProbe(model, parts.model.checkpointing.wrapped_blocks, parts.config.reshard_after_forward)
        self.memory_cadence = MemoryCadence(parts.config.memory_every)
        #: training's steps by phase since the last row that carried them (and, on every rank, since its figures were
        #: last gathered: a straggler's phases), on a CPU's clock or a CUDA stream's events; None on another device
        self.phase_totals = PhaseTotals(marks_of(parts.device)) if parts.device.type in TIMED_DEVICES else None
        #: each kind of step's FLOPs (measure/flops.py), on the rank that reports
        peak = parts.config.peak_tflops
        self.step_flops = (StepFlops(model, parts.device, peak * TERA if peak is not None else None)
                           if self.phase_totals is not None and parts.world.reports else None)
        self.next_step = NextStep()  # with ranks: set at each boundary, from rank 0's decisions
        self.figures_gathered_at = -math.inf  # with ranks: when a report last gathered each rank's figures
        self.last_memory: MemoryBreakdown | None = None  # training's last step measured by kind
        self.no_peak_said = False  # the MFU left out for want of the device's peak: said once a process
        self.update_probe = UpdateProbe(self.grad_probe)
        #: the update probe's copy of the parameters ran out of memory once: no more of them in this process
        self.updates_off = False
        #: a measured step's update figures, until its row takes them (read by the next step's transfer meanwhile)
        self.update_in_flight: UpdateFigures | None = None

    def memory_at_failure(self) -> str:
        """Memory by kind as a step that ran out of memory left it, for the OOM rescue's last paragraph: what lives
        across steps as it is now, what a step adds as last measured, and on CUDA the allocator's peak."""
        parts, last = self.parts, self.last_memory
        parameters, optimizer = self.memory_probe.held_bytes(parts.optimization.optimizer)
        kinds = [f"parameters {format_bytes(parameters)}", f"optimizer state {format_bytes(optimizer)}"]
        if last is not None:
            kinds.append(f"at step {last.step} (the last measured) gradients {format_bytes(last.gradients_bytes)} and "
                         f"activations saved for backward {format_bytes(last.activations_bytes)}")
        said = f"Memory by kind: {', '.join(kinds)}"
        if parts.device.type == "cuda":
            total = torch.cuda.get_device_properties(parts.device).total_memory
            said += (f"; the allocator's peak {format_bytes(torch.cuda.max_memory_allocated(parts.device))} of the "
                     f"device's {format_bytes(total)}")
        return said + "."

    def turn_updates_off(self, step: int) -> None:
        """The update probe's copy of the parameters did not fit beside training at ``step``: an observation must not
        end the run it observes. Its figures are left out from here on, said once; the gradient norms go on."""
        self.updates_off = True
        parts = self.parts
        if parts.device.type == "cuda":
            torch.cuda.empty_cache()
        copy = sum(param.numel() * param.element_size() for param in self.grad_probe.params)
        parts.reporter.emit(p.Log(level=p.LogLevel.WARNING, step=step, text=(
            f"step {step}: the update probe's copy of the parameters ({format_bytes(copy)}) ran out of memory: update "
            "ratios, weight norms and Adam's moments are left out for the rest of this process (a resume measures "
            "them again); gradient norms go on")))

    def say_no_peak(self, step: int) -> None:
        """Once a process: the steps' FLOPs are counted, but the device's peak is not known (a GPU the table lacks, a
        MIG slice): the MFU is left out, and how to give the peak is said."""
        if self.no_peak_said:
            return
        self.no_peak_said = True
        device = self.parts.device
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
        self.parts.reporter.emit(p.Log(level=p.LogLevel.INFO, step=step, text=(
            f"step {step}: the MFU is left out: no peak FLOP/s is known for {name} (core/engine/measure/device_peaks.py "
            "lists the GPUs it knows); --peak-tflops gives the device's peak for the run's dtype")))

    def awaits_update_figures(self, step: int) -> bool:
        """Whether step ``step``'s update figures are still to be read (its row waits for them)."""
        figures = self.update_in_flight
        return figures is not None and figures.step == step and figures.values is None

    def update_figures(self, step: int) -> dict[str, Any]:
        """Step ``step``'s update figures as its row's fields: read by the next step's transfer, or, where none came
        (the run ended first), read now, with a transfer of their own."""
        figures = self.update_in_flight
        if figures is None or figures.step != step:
            return {}
        self.update_in_flight = None
        values = figures.values if figures.values is not None else figures.packed.reshape(-1).tolist()
        return figures.named(values, self.grad_probe.module_names)

    def is_report_step(self, step: int) -> bool:
        config = self.parts.config
        return step % config.log_every == 0 or step == config.steps

    def plan(self, step: int) -> StepPlan:
        """What training's step ``step`` measures. Rank 0 reports memory (every rank holds alike); never under the
        profiler, nor on a compiled run's step that runs uncompiled (its activations are not the compiled model's).
        With ranks, rank 0's probe decision holds for every rank, so a non-finite gradient is seen by every rank
        at the same step."""
        parts = self.parts
        retries = parts.world.collectives is None
        if not self.is_report_step(step):
            return _PLANS[False, False, False, False, retries]
        every = parts.config.act_stats_every
        activations = every > 0 and step % every == 0
        eager = activations and parts.model.compiled is not None
        memory = (parts.world.reports and self.profiling.recording is None and not eager
                  and self.memory_cadence.due(step))
        probe = self.next_step.probe if parts.world.collectives is not None else self.cadence.should_probe(step)
        return _PLANS[True, activations, memory, probe, retries]

    def watch(self, plan: StepPlan, step: int) -> StepWatch:
        """Start measuring ``step``: its clock starts now."""
        return StepWatch(self, plan, step)


class StepWatch:
    """One step's instruments, from its start to its ``StepReport``."""

    def __init__(self, instruments: Instruments, plan: StepPlan, step: int) -> None:
        self._started = time.perf_counter()
        self.instruments, self.plan, self.step = instruments, plan, step
        self._graphs = compiled_graphs() if plan.report and instruments.parts.model.compiled is not None else None
        self._saved: SavedTensorCount | None = None
        self._gradients_bytes = 0
        self._act_stats: torch.Tensor | None = None
        self._probe_s = 0.0  # what the probes took on the training thread: the cadence follows it
        self._not_the_steps_s = 0.0  # inside its clock, but not its own work (``outside_the_step``)
        self._taken_before = instruments.parts.data.lengths.taken  # the step's first batch is the next taken
        #: where its time goes: training's steps, timed while it is due (step_phases.py); the batch stream marks the
        #: data's and the copy's on it
        totals = instruments.phase_totals
        self.clock = totals.clock() if plan.training and totals is not None and totals.due() else None
        instruments.parts.data.clock = self.clock
        #: its forward and backward's FLOPs and ops counted (measure/flops.py): a kind of step not counted yet
        self.counts_flops = (plan.training and instruments.step_flops is not None and totals is not None
                             and instruments.step_flops.due(compiled=instruments.parts.model.compiled is not None,
                                                          trained_s=totals.trained_s))
        self._flop_counter: Any = None
        #: the ops its compiled model runs between graphs counted (compile_census.py): due after the graphs changed, on
        #: a step whose model runs compiled and that nothing else profiles
        watch = instruments.parts.model.compile_watch
        self.takes_census = (plan.training and plan.report and not plan.activations and not self.counts_flops
                             and instruments.parts.model.compiled is not None and watch is not None
                             and watch.census_due and not torch.autograd._profiler_enabled())
        self._census_taken = False
        if plan.activations:
            instruments.activation_probe.attach()  # hooks only on sampled steps: on every step they cost ~35 %

    def counting_flops(self) -> ContextManager:
        """Around the step's forward and backward passes: its FLOPs counted, on a step that ``counts_flops``."""
        return self._counting_flops() if self.counts_flops else _NOTHING

    def census(self) -> ContextManager:
        """Around the step's first forward: what its compiled model ran eagerly counted, on a step that
        ``takes_census`` (the forward alone: what backward runs again is not counted, nor profiled)."""
        if not self.takes_census or self._census_taken:
            return _NOTHING
        from torchlab.core.engine.compile_census import census

        self._census_taken = True
        return census(self.instruments.parts.model.compile_watch)

    @contextlib.contextmanager
    def _counting_flops(self) -> Iterator[None]:
        with self.instruments.step_flops.counting() as counter:  # type: ignore[union-attr]
            self._flop_counter = counter
            yield

    def phase(self, name: str) -> ContextManager:
        """Around a phase of the step (``forward``, ``backward``, ``optimizer``, ``communication``): timed on a step
        whose phases are measured (``PhaseClock``), else nothing."""
        return getattr(self.clock, name) if self.clock is not None else _NOTHING

    def forward(self) -> ContextManager:
        """Around a micro-batch's forward: on a memory step, the first one's tensors saved for backward are
        counted (the next one's activations are made after the previous backward freed them)."""
        if self.plan.memory and self._saved is None:
            return self._counting_saved_tensors()
        return _NOTHING

    @contextlib.contextmanager
    def _counting_saved_tensors(self) -> Iterator[None]:
        with self.instruments.memory_probe.counting_saved_tensors() as saved:
            self._saved = saved
            yield

    def gradients(self, clipping: bool) -> GradNorms | None:
        """After the backward passes: the hooks of a sampled step removed, the gradients' bytes counted on a memory
        step, and their norms measured on the device when the probe is due or clipping needs them (then the probe
        costs nothing more). None: not measured, or no gradient."""
        instruments = self.instruments
        if self.plan.activations:
            self._act_stats = instruments.activation_probe.detach()
        if self._saved is not None:
            self._gradients_bytes = instruments.memory_probe.gradients_bytes()
        if not self.plan.probe:
            return instruments.grad_probe.measure(per_module=False) if clipping else None  # the step's own work
        with self._probing():
            return instruments.grad_probe.measure(per_module=True)

    @contextlib.contextmanager
    def _probing(self) -> Iterator[None]:
        """Around the probes' own work on the training thread: its time is what the cadence follows, and a phase."""
        started = time.perf_counter()
        try:
            with self.phase("probes"):
                yield
        finally:
            self._probe_s += time.perf_counter() - started

    def outside_the_step(self, work: Callable[[], None]) -> None:
        """Do ``work`` that falls inside this step's clock but is not the step's (the row of the step before, sent
        with its update figures): its time is left out of the step's."""
        started = time.perf_counter()
        try:
            with self.phase("outside"):
                work()
        finally:
            self._not_the_steps_s += time.perf_counter() - started

    def measured_update(self, update: Callable[[], bool]) -> bool:
        """The optimizer step (``update``: whether the precision took it), measured on a step the probe measures (in
        training, on the rank that reports, or on every rank where the parameters are sharded): the parameters are
        copied before it, and its figures, measured on the device after it, go with the next transfer."""
        instruments, plan = self.instruments, self.plan
        if (not plan.probe or not plan.training or instruments.updates_off
                or not (instruments.parts.world.reports or instruments.grad_probe.sharded)):
            with self.phase("optimizer"):
                return update()
        with self._probing():
            try:
                before = instruments.update_probe.before_update()
            except Exception as error:  # sharded, every rank's must be taken alike: their all-reduce follows
                if not out_of_memory(error) or instruments.grad_probe.sharded:
                    raise
                before = None
        if before is None:  # out of the except: the partial copy is gone with its frames
            instruments.turn_updates_off(self.step)
        with self.phase("optimizer"):
            stepped = update()
        if before is not None and stepped:
            with self._probing():
                instruments.update_in_flight = instruments.update_probe.after_update(
                    self.step, before, instruments.parts.optimization.optimizer)
        return stepped

    def to_host(self, loss: torch.Tensor, norms: GradNorms | None, metrics: torch.Tensor | None) -> HostValues:
        """Everything this step reports, moved to the host in one transfer: on CUDA, the step's sync point."""
        transfer = HostTransfer()
        transfer.add("loss", loss)
        transfer.add("grad_norm_total", norms.total if norms is not None else None)
        transfer.add("grad_norms", norms.per_module if norms is not None else None)  # None between the probe's steps
        transfer.add("act_stats", self._act_stats)
        transfer.add("metrics", metrics)
        in_flight = self.instruments.update_in_flight if self.plan.training else None
        if in_flight is not None and in_flight.values is None:  # the last measured step's update figures come along
            transfer.add("update", in_flight.packed)
        host = transfer.to_host()
        if in_flight is not None and in_flight.values is None:
            in_flight.values = host.vector("update")
        return host

    def _phases(self, step_time: float, compiling: bool, plan: StepPlan) -> StepPhases | None:
        """A training step's phases added to training's where it was timed (not a step that compiled: its forward
        is the compile's; nor one whose FLOPs or eager ops were counted), and their means since the last, on a row of the
        probe's and the run's last (which waits for its steps' marks)."""
        instruments = self.instruments
        totals, step_flops = instruments.phase_totals, instruments.step_flops
        if totals is None or not plan.training:
            return None
        totals.trained_s += step_time
        flops = self._flops_of_its_kind(step_flops) if step_flops is not None else None
        if self.clock is not None and not compiling and not self.counts_flops and not self.takes_census:
            totals.add(self.clock, flops)
        last = self.step == instruments.parts.config.steps
        if not plan.report or not (plan.probe or last):
            return None  # a row of the probe's carries them, and the run's last (a short run's probes may be one)
        dtype = instruments.parts.precisions.current.compute_dtype
        phases = totals.take(lambda convolutions: step_flops.peak(dtype, convolutions) if step_flops else None, wait=last)
        if phases is not None and phases.flops and phases.peak_flops_per_s is None:
            instruments.say_no_peak(self.step)
        return phases

    def _flops_of_its_kind(self, step_flops: StepFlops) -> Counted | None:
        """The FLOPs of this step's kind, counted on it where it was due; the kind the next step is expected to be."""
        parts = self.instruments.parts
        kind = step_kind(parts.data.lengths.shapes_of(self._taken_before + 1), parts.options)
        if self._flop_counter is not None:
            counted = self._flop_counter()
            step_flops.record(kind, counted)
            parts.reporter.emit(flops_counted(self.step, kind, counted))
        step_flops.last_kind = kind
        return step_flops.counted(kind)

    def finish(self, host: HostValues, update: Update) -> StepReport:
        """The step as the host sees it, once its optimizer step is taken (the optimizer's state, counted on a
        memory step, exists from the first). Its time is the step's own: reporting it is not part of it."""
        step_time = time.perf_counter() - self._started - self._not_the_steps_s
        instruments, parts, plan = self.instruments, self.instruments.parts, self.plan
        if self.clock is not None:
            self.clock.finish()
            parts.data.clock = None
        memory = None
        if self._saved is not None:
            longest = parts.data.lengths.measured_on_longest(self._taken_before, parts.device.type == "cuda")
            memory = instruments.memory_probe.breakdown(self.step, self._saved, self._gradients_bytes,
                                                        parts.optimization.optimizer, parts.device, longest)
        if plan.training:
            instruments.cadence.record_step(step_time)
            if plan.probe and self._probe_s > 0:
                instruments.cadence.record_probe(self.step, self._probe_s)  # it follows its cost
            if memory is not None:
                instruments.memory_cadence.measured()
                instruments.last_memory = memory
        # torch.compile compiled again in this step (a guard failed): its time is compile time, not training's.
        compiling = self._graphs is not None and compiled_graphs() != self._graphs
        if compiling and parts.model.compile_watch is not None:
            parts.model.compile_watch.compile_s += step_time  # the impact table leaves it out: compile time
        grad_norms, act_stats, metrics = host.vector("grad_norms"), host.vector("act_stats"), host.vector("metrics")
        data_wait = parts.data.take_wait()
        phases = self._phases(step_time, compiling, plan)
        lr_groups, metric_names = parts.lr_groups, parts.loss.metric_names.names
        return StepReport(
            step=self.step,
            options=update.options,
            loss=update.loss,
            lr=update.lrs_used[0],
            stepped=update.stepped,
            grad_norm_total=update.grad_norm_total,
            clipped=update.clipped,
            grad_norms=_named(instruments.grad_probe.module_names, grad_norms),
            act_stats=stats_by_module(instruments.activation_probe.module_names, act_stats) if act_stats is not None else None,
            step_time_s=step_time,
            data_wait_s=data_wait,
            phases=phases,
            memory=memory,
            metrics=_named(metric_names, metrics),
            lrs=_named(lr_groups, update.lrs_used),
            compiling=compiling,
            ran_eagerly=plan.activations and parts.model.compiled is not None,
            spike=update.spike,
        )


def _named(names: Any, values: list[float] | None) -> dict[str, float] | None:
    return dict(zip(names, values)) if names is not None and values is not None else None
