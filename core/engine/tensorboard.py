"""A run's figures as TensorBoard event files, written with ``torch.utils.tensorboard`` (the ``tensorboard``
extra): while it trains (``--tensorboard DIR``, ``LiveTensorBoard``) or afterwards from its files
(``torchlab-tui export RUN --tensorboard DIR``, core/launch/export.py).

Tags: ``train/loss``, ``train/lr`` (``train/lr/<group>`` for a workload's optimizer with several groups),
``train/samples_per_s``, ``train/step_time_s``, ``train/grad_norm_total``, ``val/loss``, the workload's own
metrics as ``train/<name>`` and ``val/<name>``, ``grad_norm/<module>``, ``update_ratio/<module>``,
``weight_norm/<module>``, ``adam_m/<module>`` and ``adam_sqrt_v/<module>``, ``memory/<kind>`` (bytes); option
changes as text under ``options`` (a resume's changed options among them: core/records/option_history.py); profiler traces as ``plugins/profile/step-<N>/torchlab.pt.trace.json``,
where the PyTorch Profiler plugin of TensorBoard finds them. A trace is copied by a read and a write of our
own: one that is a link (to ``/etc/shadow``, in a run someone else prepared), a FIFO or a device is refused
(UnsafeFileError), and the copy replaces the name it goes to rather than write through a link there.

Serialising a scalar costs ~0.1 ms (measured here), so a training step with 30 modules' norms would pay 3 ms:
the live writer does its work on a thread of its own, and writes at most ``LIVE_ROWS_PER_S`` rows a second
(every row of a slower run; evaluation rows always). ``export`` writes every row.
"""

from __future__ import annotations

import collections
import os
import shutil
import sys
import threading
import time
from pathlib import Path

from torchlab.core.errors import ConfigError
from torchlab.core.records.export_files import COPY_CHUNK, output_file
from torchlab.core.records.option_history import OptionChange, changes_recorded
from torchlab.core.records.storage import make_folder
from torchlab.core.safe_open import UnsafeFileError, open_regular
from torchlab.core.wire import events
from torchlab.core.wire import protocol as p
from torchlab.core.wire.metrics_row import MetricsRow
from torchlab.core.wire.observer import TrainerObserver
from torchlab.core.wire.options import format_option_value

#: While training, at most this many metrics rows a second go to TensorBoard: each costs ~0.1 ms a scalar on
#: the writer's thread (holding the GIL the training thread needs), ~3 ms for a row with 30 modules' norms.
LIVE_ROWS_PER_S = 5
#: The name a profiler trace takes under ``plugins/profile/step-<N>/`` (the plugin reads ``*.pt.trace.json``).
TRACE_NAME = "torchlab.pt.trace.json"
INSTALL_HINT = "pip install 'torchlab-tui[tensorboard]' (or pip install tensorboard)"


def summary_writer_class(directory: Path) -> type:
    """torch's ``SummaryWriter``, or a ConfigError saying how to install what it needs."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # torch's module imports tensorboard, which is an extra
        raise ConfigError(f"tensorboard (--tensorboard) {directory}: TensorBoard is not installed: {INSTALL_HINT}.") from None
    return SummaryWriter


class TensorBoardWriter:
    """Metrics rows (read back from ``metrics.jsonl``, or as the trainer reports them), option changes and
    profiler traces into event files under ``directory``."""

    def __init__(self, directory: Path, purge_step: int | None = None) -> None:
        SummaryWriter = summary_writer_class(directory)
        self.directory = directory
        try:
            if not directory.is_dir():  # as private as the folder it is in (0700 in a run directory), not the umask's
                make_folder(directory)
            # purge_step: a resumed run hides what an earlier process wrote after the step it resumed at
            self._writer = SummaryWriter(str(directory), purge_step=purge_step)
        except OSError as error:
            raise ConfigError(f"tensorboard (--tensorboard) {directory}: cannot be written: {error.strerror or error}.") from None

    def write_row(self, row: MetricsRow) -> None:
        step, walltime = row.step, row.time

        def scalar(tag: str, value: float | None) -> None:
            if value is not None:  # None: not measured on this step, or not finite when written
                self._writer.add_scalar(tag, value, step, walltime=walltime)

        scalar("train/loss", row.loss)
        scalar("train/samples_per_s", row.samples_per_s)
        scalar("train/step_time_s", row.step_time_s)
        scalar("train/grad_norm_total", row.grad_norm_total)
        if row.lrs is not None:
            for group, lr in row.lrs.items():
                scalar(f"train/lr/{group}", lr)
        else:
            scalar("train/lr", row.lr)
        scalar("val/loss", row.val_loss)
        for prefix, figures in (("train", row.metrics), ("val", row.val_metrics)):
            for name, value in (figures or {}).items():
                scalar(f"{prefix}/{name}", value)
        for module, norm in (row.grad_norms or {}).items():
            scalar(f"grad_norm/{module}", norm)
        for module, ratio in (row.update_ratios or {}).items():
            scalar(f"update_ratio/{module}", ratio)
        for module, norm in (row.weight_norms or {}).items():
            scalar(f"weight_norm/{module}", norm)
        for module, (first, root) in (row.adam or {}).items():
            scalar(f"adam_m/{module}", first)
            scalar(f"adam_sqrt_v/{module}", root)
        memory = row.memory
        if memory is not None:
            scalar("memory/parameters", memory.parameters_bytes)
            scalar("memory/gradients", memory.gradients_bytes)
            scalar("memory/optimizer", memory.optimizer_bytes)
            scalar("memory/activations", memory.activations_bytes)
            if memory.gathered_bytes:
                scalar("memory/gathered", memory.gathered_bytes)
            scalar("memory/allocator_peak", memory.allocator_peak_bytes)

    def write_option_change(self, change: OptionChange) -> None:
        """``change`` as a line of the ``options`` text, at its step: "step 41: amp = bf16 (was off), from --resume"."""
        option = change.option
        text = f"{change.describe()} (was {format_option_value(option, change.previous)})"
        self._writer.add_text("options", text + (f", from {change.source}" if change.source else ""), change.step)

    def add_trace(self, step: int, trace: Path) -> None:
        """A profiler snapshot's Chrome trace, where TensorBoard's PyTorch Profiler plugin reads it. A ``trace``
        that is a link, a FIFO or a device is an UnsafeFileError, and nothing is copied: a link in a run
        someone else prepared could point at any file of the user's (``/etc/shadow`` for root)."""
        with open(trace, "rb", opener=open_regular) as source:  # refused before a folder is made for it
            folder = make_folder(self.directory / "plugins" / "profile" / f"step-{step}")
            with output_file(folder / TRACE_NAME, replace=True) as target:  # a name replaced, never written through
                shutil.copyfileobj(source, target, COPY_CHUNK)  # from handle to handle: no path, no link followed

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class LiveTensorBoard(TrainerObserver):
    """``--tensorboard DIR`` while training: what the trainer reports is queued (a deque append on the training
    thread) and written on a thread of this observer's own; closed when the run ends."""

    def __init__(self, directory: Path) -> None:
        summary_writer_class(directory)  # not installed: said before training starts
        self.directory = directory
        self.writer: TensorBoardWriter | None = None  # opened when the run starts, at the step it starts from
        #: a metrics row, an option change (``option_applied``, or a resume's ``resume_changed_settings``) or a profile
        self._queue: collections.deque[MetricsRow | OptionChange | p.ProfileReady] = collections.deque()
        self._wake = threading.Event()
        self._row_written_at = -1.0
        self._row_held_back: MetricsRow | None = None  # the newest row not written: the run's last, perhaps
        self._closing = False
        self._thread = threading.Thread(target=self._write, name="tensorboard", daemon=True)
        self._thread.start()

    def on_metrics(self, row: MetricsRow) -> None:
        if self.writer is None or self._closing:
            return
        now = time.monotonic()
        if row.val_loss is not None or now - self._row_written_at >= 1 / LIVE_ROWS_PER_S:
            self._row_written_at, self._row_held_back = now, None
            self._queue.append(row)
            self._wake.set()
        else:
            self._row_held_back = row

    def on_event(self, event: p.Message) -> None:
        match event:
            case events.RunStarted() if self.writer is None:
                # A resumed run hides what an earlier process wrote after the step it resumed at.
                self.writer = TensorBoardWriter(self.directory, purge_step=event.step + 1 if event.step else None)
                return
            case p.OptionApplied() | events.ResumeChangedSettings():  # the one reading of a change: option_history
                self._queue.extend(changes_recorded(event.journal_record()))
                if self.writer is None:  # a resume's changes come before run_started: written with the first row
                    return
            case p.ProfileReady() if not event.error:
                self._queue.append(event)
            case events.RunEnded() | p.Error() | p.NonFinite():
                self.close()
                return
            case _:
                return
        self._wake.set()

    def close(self) -> None:
        """Write what is queued, then close the files (the run ended; idempotent)."""
        if self._closing:
            return
        if self._row_held_back is not None:  # the run's last row is written, however soon after the one before
            self._queue.append(self._row_held_back)
        self._closing = True
        self._wake.set()
        if self.writer is not None:
            self._thread.join(timeout=30)

    def _write(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self.writer is None:  # closed before the run started
                return
            closing = self._closing  # read before the drain: what close() queued before saying so is written
            while self._queue:
                match item := self._queue.popleft():
                    case MetricsRow():
                        self.writer.write_row(item)
                    case OptionChange():
                        self.writer.write_option_change(item)
                    case p.ProfileReady():
                        self._copy_trace(item)
            self.writer.flush()
            if closing:
                self.writer.close()
                return

    def _copy_trace(self, profile: p.ProfileReady) -> None:
        trace = Path(profile.dir) / "trace.json"
        if os.path.lexists(trace):
            try:
                self.writer.add_trace(profile.first_step, trace)
            except (OSError, UnsafeFileError) as error:  # the thread goes on writing rows
                print(f"torchlab: the profiler trace of step {profile.first_step} was not copied to "
                      f"TensorBoard: {error}", file=sys.stderr)


def tensorboard_observers(config) -> list[LiveTensorBoard]:
    """The run's live TensorBoard writer where ``--tensorboard`` asked for one."""
    return [LiveTensorBoard(Path(config.tensorboard))] if config.tensorboard else []
