"""The run's forecaster, seen from its supervisor: what the app's "what fits" and its keys read their predictions from.

At the first ``ForecastCommand`` the supervisor starts the forecaster process (forecaster_process.py: idle priority, one
thread, the workload built without its weights) and asks it for the settings in force and each change worth
weighing (``worth_asking``); from then on, each change of a setting that shapes memory is asked around too, each
setting once. Its answers, ``memory_predicted`` events, reach the supervisor's observers as they come (the
journal, the app) from the thread that reads them: predictions never wait for a step, and a step never waits for
them.

The settings in force are followed from the run's own events (``run_started``, ``option_applied``), as the app
follows them, so that the supervisor needs no trainer of its own: with ranks it holds none.

Each setting predicted is checked once the run has trained with it (``prediction_checked``, the journal's
``prediction`` record): on CUDA the allocator's peak (``max_memory_allocated``) against the predicted peak, on a CPU
the tensors training holds by kind against the predicted kinds. The median of measured over predicted on this run
corrects every prediction after it (the allocator's rounding, cuBLAS's workspace: what the fake step does not
allocate); a correction that moves by 2 % or more asks again for what was predicted before it.

With batches of varying length the longest the run has taken is the one to predict with: the trainer announces each
longer one (``longest_batch``), every setting is asked again with its shapes (the forecaster's cache answers at once
where the batch it runs is no longer: a run of one length predicts each setting once), an answer to a question asked
with a shorter one is dropped, and a prediction is checked only against a memory step measured on a batch as long.

The OOM rescue with ranks asks it too (``rung_to_fit``): their supervisor holds no model, so the rung that fits a
rank is predicted here, at normal priority, while the ranks are down; that starts the process where the app has not,
and makes it follow nothing else.
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import psutil

from torchlab.core.engine.forecast.rung_choice import first_rung_to_fit
from torchlab.core.engine.forecast.step_shape import StepShape, candidate_shapes, configured_shape
from torchlab.core.engine.measure.nvml import Nvml
from torchlab.core.engine.parts import resolve_device
from torchlab.core.errors import ForecastError, TorchlabError
from torchlab.core.options import MEMORY_SHAPING, LiveOption, LiveOptions, parse_option_value
from torchlab.core.records.config import TrainConfig
from torchlab.core.records.storage import create_file
from torchlab.core.wire.codec import ProtocolError, decode
from torchlab.core.wire.events import (
    ALLOCATOR_PEAK, TENSORS, LongestBatch, MemoryPredicted, PredictionChecked, RunStarted,
)
from torchlab.core.wire.metrics_row import MetricsRow
from torchlab.core.wire.payloads import MemoryBreakdown, MemoryPrediction
from torchlab.core.wire.protocol import Log, LogLevel, Message, OptionApplied

FORECASTER_MODULE = "torchlab.core.engine.forecast.forecaster_process"
#: A setting is checked on a memory step this many steps after it came in force, or later: the first steps after a
#: change make what later ones reuse (the optimizer's state, a compile), which is not the step predicted.
CHECK_AFTER_STEPS = 2
#: A correction that moves by this much asks again for the settings predicted before it.
RATIO_MOVED = 0.02
#: The OOM rescue with ranks waits this long for the splits it asks (the ranks are down meanwhile; a cold forecaster
#: loads the workload first): past it, the ladder goes one rung down as it did without a forecast.
RESCUE_WAIT_S = 60.0


def worth_asking(options: LiveOptions, batch_size: int, reshard_after_forward: bool, gpus: int | None) -> list[tuple[str, StepShape]]:
    """The settings in force first, then each change worth weighing: ``torchlab-tui plan``'s candidates
    (``candidate_shapes``: each amp mode, checkpointing switched, the split doubled, a batch twice as large, the
    ranks of ``gpus`` under DDP and FSDP2, every saving at once), each named by the change that makes it."""
    in_force = configured_shape(options, batch_size, reshard_after_forward)
    listed = candidate_shapes(in_force, gpus)
    return [("in force", in_force), *listed[1:]]


class Forecaster:
    """Starts the forecaster process on demand, asks it what the run's settings would take, and emits its answers."""

    def __init__(self, config: TrainConfig, explicit: set[str], run_dir: Path, emit: Callable[[Message], None],
                 gpus: Callable[[], int | None]) -> None:
        self.config = config
        self.explicit = set(explicit)
        self.run_dir = Path(run_dir)
        self.emit = emit
        self.gpus = gpus
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._closing = False
        self._following = False  # the app asked what fits: changes of the settings are predicted around from then on
        self._ended = False  # its process ended: nothing more will be answered
        self._asked: set[StepShape] = set()
        self._options: LiveOptions | None = None  # in force, from the run's events
        self._batch_size = 0
        self._step = 0
        self._held_bytes = 0
        self._predicted: dict[StepShape, MemoryPrediction] = {}  # as the forecaster predicted them, uncorrected
        self._answers: dict[StepShape, MemoryPredicted] = {}  # its newest answer for each setting
        self._answered = threading.Condition(self._lock)
        self._requests: queue.SimpleQueue[str | None] = queue.SimpleQueue()  # to the process, in order (``_write``)
        self._checked: set[StepShape] = set()
        self._ratios: list[float] = []  # measured over predicted, of each setting checked
        self._ratio: float | None = None  # their median: what corrects the predictions from now on
        self._rows_options: LiveOptions | None = None
        self._rows_shape: StepShape | None = None  # the settings of the newest metrics row, in force from
        self._rows_shape_since = 0  # ... this step
        self._longest: LongestBatch | None = None  # the run's longest batch so far: what is predicted with

    @property
    def started(self) -> bool:
        return self._process is not None

    # ------------------------------------------------------------------ the run's records, as they pass
    def observe(self, event: Message) -> None:
        """Follow the settings in force; once started, a change of one that shapes memory is asked around."""
        match event:
            case RunStarted():
                with self._lock:
                    self._options = LiveOptions(**{name: parse_option_value(name, value) for name, value in event.options.items()})
                    self._batch_size, self._step = event.batch_size, event.step
                if self._following:  # the first trainer, or the ranks after a relaunch
                    self.ask()
            case OptionApplied() if self._options is not None:
                with self._lock:
                    self._options = self._options.with_value(event.option, parse_option_value(event.option, event.value))
                    self._step = event.step
                if event.option in MEMORY_SHAPING and self._following:
                    self.ask()
            case LongestBatch():
                with self._lock:
                    if self._longest is not None and event.elements <= self._longest.elements:
                        return
                    self._longest = event
                    self._asked.clear()  # every setting again, with it
                    self._checked.clear()
                    self._predicted.clear()  # what a memory step is checked against: the answers with it, to come
                if self._following:
                    self.ask()

    def observe_row(self, row: MetricsRow) -> None:
        self._step = row.step
        if row.options is not self._rows_options:  # rows share the options object in force until a command changes it
            self._rows_options = row.options
            shape = configured_shape(row.options, self._batch_size, self.config.reshard_after_forward)
            if shape != self._rows_shape:
                self._rows_shape, self._rows_shape_since = shape, row.step
        if row.memory is not None:  # what training's tensors hold now, every rank's (rank 0's as each rank's)
            self._held_bytes = row.memory.total_bytes * (self._options.world_size if self._options else 1)
            if row.step >= self._rows_shape_since + CHECK_AFTER_STEPS:
                self._check(self._rows_shape, row.memory, row.step)

    def _check(self, shape: StepShape, memory: MemoryBreakdown, step: int) -> None:
        """The prediction for ``shape`` against what this memory step measured, once a setting."""
        predicted = self._predicted.get(shape)
        if predicted is None or predicted.refused is not None or shape in self._checked or not memory.longest_batch:
            return
        self._checked.add(shape)
        if memory.allocator_peak_bytes is not None:
            measure, measured, expected = ALLOCATOR_PEAK, memory.allocator_peak_bytes, predicted.peak_bytes
        else:
            measure, measured, expected = TENSORS, memory.total_bytes, predicted.total_bytes
        if expected <= 0:
            return
        self._ratios.append(measured / expected)
        ratio, before = statistics.median(self._ratios), self._ratio
        self._ratio = ratio
        self.emit(PredictionChecked(step=step, settings=dataclasses.asdict(shape), measure=measure,
                                    predicted_bytes=expected, measured_bytes=measured, error=measured / expected - 1,
                                    ratio=ratio))
        if abs(ratio - (before or 1.0)) >= RATIO_MOVED and self._following:
            with self._lock:
                self._asked.clear()  # the forecaster's cache answers them again at once, corrected
            self.ask()

    # ------------------------------------------------------------------ asking
    def start(self) -> None:
        """Start the process (once) and ask it about the settings in force and the changes worth weighing."""
        with self._lock:
            self._following = True
            self._start_process()
        self.ask()

    def _start_process(self, *, urgent: bool = False) -> None:
        """Start the process once (the lock held). Where its log cannot be made (a link or a FIFO another user left
        in the run directory as ``forecaster.log``, a full disk), nothing is predicted this run, and the log says why."""
        if self._process is not None or self._closing or self._ended:
            return
        try:
            self._process = self._spawn(urgent)
        except (OSError, TorchlabError) as cannot:
            self._ended = True
            self.emit(Log(level=LogLevel.WARNING, text=f"what fits: the forecaster was not started ({cannot}): nothing "
                                                       f"is predicted this run"))

    def rung_to_fit(self, options: LiveOptions, option: LiveOption, values: list[Any], world_size: int) -> tuple[Any, str]:
        """The OOM rescue with ranks (core/engine/ranks/rescue.py): of ``option``'s rungs ``values`` from ``options``
        (the splits to pieces of one sample, or the checkpointing rungs), the first predicted to fit a rank's memory,
        and what was predicted; asked of the forecaster process (started for it where the app has not) one at a time,
        and waited for, while the ranks are down."""
        deadline = time.monotonic() + RESCUE_WAIT_S

        def predicted(value: Any) -> MemoryPrediction:  # one at a time: the first that fits ends the asking
            shape = configured_shape(options.with_value(option.name, value), self._batch_size,
                                     self.config.reshard_after_forward)
            answer = self._predict_now(shape, max(0.0, deadline - time.monotonic()))
            if answer is None:
                raise ForecastError("the forecaster is not running" if self._ended else
                                    f"the forecaster gave no answer in {RESCUE_WAIT_S:.0f} s")
            if answer.prediction is None:
                raise ForecastError(answer.error)
            return dataclasses.replace(answer.prediction, peak_bytes=answer.corrected_peak_bytes or answer.prediction.peak_bytes)

        return first_rung_to_fit(option, values, predicted, self._rank_room(world_size), f"each of {world_size} ranks has")

    def _predict_now(self, shape: StepShape, timeout: float) -> MemoryPredicted | None:
        """``shape`` predicted (asked now where it was not before): its answer, None where none came in ``timeout``."""
        with self._lock:
            self._start_process(urgent=True)
            self._send([("the OOM rescue's", shape)], urgent=True)
            self._answered.wait_for(lambda: self._ended or shape in self._answers, timeout)
            return self._answers.get(shape)

    def _rank_room(self, world_size: int) -> int:
        """The memory a rank has now, the ranks being down: a GPU's free memory (NVML's: this process makes no CUDA
        context), or its share of the RAM available, which the ranks that ran out of it have given back."""
        if resolve_device(self.config.device).type == "cuda":
            nvml = Nvml()
            try:
                gpus = nvml.sample([])
            finally:
                nvml.close()
            free = [gpu.memory_total_bytes - gpu.memory_used_bytes for gpu in gpus[:world_size]
                    if gpu.memory_total_bytes is not None and gpu.memory_used_bytes is not None]
            if free:
                return min(free)
        return psutil.virtual_memory().available // world_size

    def ask(self) -> None:
        """Ask for every setting worth weighing from those in force that has not been asked yet. Before the run
        started (no settings in force yet) nothing is asked: ``run_started`` asks once it comes."""
        with self._lock:
            process, options = self._process, self._options
            if process is None or options is None or process.stdin is None or not self._following:
                return
            self._send(worth_asking(options, self._batch_size, self.config.reshard_after_forward, self.gpus()))

    def _send(self, asked: list[tuple[str, StepShape]], *, urgent: bool = False) -> None:
        """Ask the process for each of ``asked`` (change, settings) not asked before (the lock held); ``urgent``: the
        OOM rescue's, which training waits for (forecaster_process.py ``_priority_for``)."""
        if self._process is None:
            return
        for change, shape in asked:
            if shape in self._asked:
                continue
            self._asked.add(shape)
            longest = self._longest
            self._requests.put(json.dumps({"settings": dataclasses.asdict(shape), "change": change, "step": self._step,
                                           "held_bytes": self._held_bytes, "ratio": self._ratio, "urgent": urgent,
                                           "longest_batch": longest.shapes if longest is not None else None,
                                           "longest_elements": longest.elements if longest is not None else None}))

    def close(self) -> None:
        """End the process (its stdin closed: it leaves after the prediction it is making; killed if it does not)."""
        with self._lock:
            self._closing = True
            process, self._process = self._process, None
        if process is None:
            return
        self._requests.put(None)  # its writer closes its stdin once what was asked is written
        try:
            process.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    # ------------------------------------------------------------------ the process
    def _spawn(self, urgent: bool) -> subprocess.Popen:
        log = os.fdopen(create_file(self.run_dir / "forecaster.log"), "w")
        environment = {**os.environ, "OMP_NUM_THREADS": "1"}
        process = subprocess.Popen([sys.executable, "-m", FORECASTER_MODULE, "--run-dir", str(self.run_dir)], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=log, text=True, encoding="utf-8", env=environment)
        log.close()  # the child holds its own
        setup = {"config": self.config.to_toml(), "explicit": sorted(self.explicit), "urgent": urgent,
                 "idle": self.config.forecast_priority == "idle"}
        self._requests.put(json.dumps(setup))
        threading.Thread(target=self._write, args=(process,), name="forecaster-requests", daemon=True).start()
        threading.Thread(target=self._read, args=(process,), name="forecaster-answers", daemon=True).start()
        return process

    def _write(self, process: subprocess.Popen) -> None:
        """Write each request to the process as it is asked: on a thread of its own, so that a forecaster that does
        not read (busy, or waiting for an idle core) never holds up the thread that asks, the training loop's."""
        while (line := self._requests.get()) is not None:
            try:
                process.stdin.write(line + "\n")
                process.stdin.flush()
            except (BrokenPipeError, OSError, ValueError):  # it ended: its reader says so
                return
        try:
            process.stdin.close()
        except (BrokenPipeError, OSError):
            pass

    def _read(self, process: subprocess.Popen) -> None:
        answers: IO[str] = process.stdout
        for line in answers:
            try:
                answer = decode(line)
            except ProtocolError:
                continue  # not one of its answers (a library's print): its log is the place for that
            if isinstance(answer, MemoryPredicted):
                shape = StepShape(**answer.settings)
                with self._lock:
                    longest = self._longest.elements if self._longest is not None else None
                    if answer.longest_batch_elements != longest:
                        continue  # asked with a shorter batch: asked again with the longest
                    if answer.prediction is not None:
                        self._predicted[shape] = answer.prediction
                    self._answers[shape] = answer
                    self._answered.notify_all()
                self.emit(answer)
        status = process.wait()
        with self._lock:
            self._ended = True
            self._answered.notify_all()  # nothing more will come: a rescue waiting for it goes on without
        if not self._closing:
            self.emit(Log(level=LogLevel.WARNING, text=f"the forecaster process ended (exit status {status}): no more "
                                                       f"predictions this run; its output is in forecaster.log"))

