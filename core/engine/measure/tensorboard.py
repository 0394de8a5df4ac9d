"""A run's figures as TensorBoard event files, written with ``torch.utils.tensorboard`` (the ``tensorboard``
extra): while it trains (``--tensorboard DIR``, ``LiveTensorBoard``) or afterwards from its files
(``torchlab-tui export RUN --tensorboard DIR``, core/launch/export.py).

Tags: ``train/loss``, ``train/lr`` (``train/lr/<group>`` for a workload's optimizer with several groups),
``train/samples_per_s``, ``train/step_time_s``, ``train/grad_norm_total``, ``val/loss``, the workload's own
metrics as ``train/<name>`` and ``val/<name>``, ``grad_norm/<module>``, ``update_ratio/<module>``,
``weight_norm/<module>``, ``adam_m/<module>`` and ``adam_sqrt_v/<module>``, ``memory/<kind>`` (bytes), ``time/<phase>_s``
(where a step's time went: core/engine/measure/step_phases.py), ``perf/flops_per_s`` and ``perf/mfu``;
``compile/seconds``, ``compile/graphs``, ``compile/graph_breaks`` and ``compile/recompiles`` at each compile report,
its breaks and recompiles as text under ``compile`` (core/engine/compile_watch.py); option
changes as text under ``options`` (a resume's changed options among them: core/records/option_history.py); profiler traces as ``plugins/profile/step-<N>/torchlab.pt.trace.json``,
where the PyTorch Profiler plugin of TensorBoard finds them. A trace is copied by a read and a write of our
own: one that is a link (to ``/etc/shadow``, in a run someone else prepared), a FIFO or a device is refused
(UnsafeFileError), and the copy replaces the name it goes to rather than write through a link there.

``--tensorboard DIR`` meets the folder rule (core/safe_open.py ``who_else_may_change``) in both commands, before
anything is written and again once the folder is made: TensorBoard names its event file by time, host and process
and opens it by that name itself, so a link put in a folder someone else may write into would be written
through, and a folder they own, or may swap, lets them read the run's figures. DIR itself is never a link. A
new one is made 0700 whatever the umask, and missing folders above it 0755 less the umask
(``make_tensorboard_folder``): the event files hold the run's curves, module names and option changes, as
private as the run directory by default; to share them, give a folder you made for that (its mode is kept).

A write TensorBoard's own thread fails (a full disk) is kept by its writer and raised again on the next write,
flush or close, where torchlab says it in a paragraph; that thread's own report (a traceback printed by
``threading``) is left out (``_quiet_event_writer_threads``). While training, such a failure stops the event
files, not the run: one line on stderr says so.

Serialising a scalar costs ~0.1 ms (measured here), so a training step with 30 modules' norms would pay 3 ms:
the live writer does its work on a thread of its own, and writes at most ``LIVE_ROWS_PER_S`` rows a second
(every row of a slower run; evaluation rows always). ``export`` writes every row.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import shutil
import stat
import sys
import threading
import time
from pathlib import Path
from typing import Any

from torchlab.core.errors import ConfigError
from torchlab.core.records.export_files import COPY_CHUNK, output_file
from torchlab.core.records.option_history import OptionChange, changes_recorded
from torchlab.core.records.rank_history import rank_event
from torchlab.core.records.storage import make_folder, make_folders_above, reason
from torchlab.core.safe_open import (
    UnsafeFileError, kind_of, open_regular, refuse_a_path_too_long, who_else_may_change,
)
from torchlab.core.wire.compile_report import CompileReport
from torchlab.core.wire.hang import Hang, hang_sentence
from torchlab.core.wire.straggler import Straggler, straggler_sentence
from torchlab.core.wire import events
from torchlab.core.wire import protocol as p
from torchlab.core.wire.metrics_row import MetricsRow
from torchlab.core.wire.observer import TrainerObserver
from torchlab.core.options import format_option_value

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


def refuse_an_unfit_tensorboard_folder(directory: Path, *, writer: str = "torchlab") -> None:
    """A ConfigError naming ``--tensorboard`` unless ``directory`` may take event files: a name of a length
    that fits, no link, a folder or nothing yet, and the folder rule (the module's docstring). ``writer`` names
    who writes, for the refusal of a link (``an export``)."""
    refuse_a_path_too_long("--tensorboard", directory)
    flag = f"--tensorboard {directory}"
    try:
        status = os.lstat(directory)
    except (FileNotFoundError, NotADirectoryError):  # a file on the way: judged by the rule below
        status = None
    except OSError as error:
        raise ConfigError(f"{flag}: cannot be written: {reason(error)}.") from None
    if status is not None and stat.S_ISLNK(status.st_mode):
        raise ConfigError(f"{flag} is a symbolic link: {writer} writes into no folder through a link, which whoever "
                          "made it could point at a folder of yours. Give the folder itself, or a new one "
                          f"({writer} makes it).")
    if status is not None and not stat.S_ISDIR(status.st_mode):
        raise ConfigError(f"{flag} is {kind_of(status.st_mode)}, not a folder: give a new folder ({writer} makes it) "
                          "or an empty one.")
    try:
        fault = who_else_may_change(directory)
    except OSError as error:
        raise ConfigError(f"{flag}: cannot be written: {reason(error)}.") from None
    if fault is None:
        return
    if fault.where != "itself":
        raise ConfigError(f"{flag} {fault}: they could swap it for a folder of theirs while TensorBoard writes into "
                          "it, and read or redirect what it writes. Give a --tensorboard folder in a folder of yours "
                          f"({writer} makes it private).")
    if fault.theirs:
        raise ConfigError(f"{flag} {fault}: they could put a link where TensorBoard writes its event file, which would "
                          f"be written through, and read what it writes. Give a new folder in a folder of yours ({writer} "
                          "makes it private).")
    raise ConfigError(f"{flag} {fault}: one of them could put a link where TensorBoard writes its event file, and it "
                      f"would be written through. Give a new folder ({writer} makes it private), or chmod go-w "
                      f"{directory} first.")


def make_tensorboard_folder(directory: Path, *, writer: str = "torchlab") -> list[Path]:
    """``directory`` made 0700 whatever the umask (the module's docstring), and the folders above it that are
    missing 0755 less the umask; a folder there already keeps its mode. Judged by the folder rule before and
    again after (someone may have made a part first): a ConfigError, after removing what this made. The folders
    made, outermost first, for the caller to remove if what it writes fails."""
    refuse_an_unfit_tensorboard_folder(directory, writer=writer)
    made = make_folders_above(directory)
    try:
        try:
            os.mkdir(directory, 0o700)
            made.append(directory)
        except FileExistsError:  # there already, or made meanwhile: judged below, as anything on the way
            pass
        refuse_an_unfit_tensorboard_folder(directory, writer=writer)
    except BaseException:
        remove_folders(made)
        raise
    return made


def remove_folders(made: list[Path]) -> None:
    """Remove the folders in ``made`` (outermost first) that are empty, innermost first."""
    for folder in reversed(made):
        try:
            os.rmdir(folder)
        except OSError:  # something in it: not ours to remove
            return


def _quiet_event_writer_threads() -> None:
    """Leave out the report ``threading`` prints for a failed TensorBoard writer thread (the module's docstring):
    its writer raises that failure again to the code that writes, which says it. Any other thread's is printed."""
    global _EVENT_WRITER_THREAD
    if _EVENT_WRITER_THREAD is not None:
        return
    from tensorboard.summary.writer.event_file_writer import _AsyncWriterThread

    _EVENT_WRITER_THREAD = _AsyncWriterThread
    print_report = threading.excepthook

    def report(args: threading.ExceptHookArgs) -> None:
        if not (isinstance(args.thread, _AsyncWriterThread) and isinstance(args.exc_value, OSError)):
            print_report(args)

    threading.excepthook = report


_EVENT_WRITER_THREAD: type | None = None


class TensorBoardWriter:
    """Metrics rows (read back from ``metrics.jsonl``, or as the trainer reports them), option changes and
    profiler traces into event files under ``directory``."""

    def __init__(self, directory: Path, purge_step: int | None = None) -> None:
        """Event files under ``directory``, a folder ``make_tensorboard_folder`` made or judged. An OSError where
        the first event cannot be written (a full disk), for the caller to say with what it means for it."""
        SummaryWriter = summary_writer_class(directory)
        _quiet_event_writer_threads()
        self.directory = directory
        # purge_step: a resumed run hides what an earlier process wrote after the step it resumed at
        self._writer = SummaryWriter(str(directory), purge_step=purge_step)

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
        if row.phases is not None:  # each phase's mean seconds over the steps since the row before that had them
            for phase, seconds in row.phases.seconds().items():
                scalar(f"time/{phase}_s", seconds)
            scalar("perf/flops_per_s", row.phases.flops_per_s)  # where the steps' FLOPs were counted
            scalar("perf/mfu", row.phases.mfu)

    def write_option_change(self, change: OptionChange) -> None:
        """``change`` as a line of the ``options`` text, at its step: "step 41: amp = bf16 (was off), from --resume"."""
        option = change.option
        text = f"{change.describe()} (was {format_option_value(option, change.previous)})"
        self._writer.add_text("options", text + (f", from {change.source}" if change.source else ""), change.step)

    def write_compile_report(self, record: dict[str, Any]) -> None:
        """A ``compile_report`` (its journal record: the live event's, or a line of events.jsonl) at its step: the
        compile seconds, graphs, graph breaks, recompiles and ops run eagerly between graphs (once counted) as scalars,
        and each break and recompile as a line of the ``compile`` text."""
        step = int(record.get("step") or 0)
        breaks, recompiles = record.get("breaks") or [], record.get("recompiles") or []
        for tag, value in (("compile/seconds", record.get("compile_s")), ("compile/graphs", record.get("graphs")),
                           ("compile/graph_breaks", len(breaks)), ("compile/recompiles", len(recompiles)),
                           ("compile/eager_ops", record.get("eager_ops"))):
            if isinstance(value, (int, float)):
                self._writer.add_scalar(tag, value, step)
        breaks, recompiles = [_fields(entry) for entry in breaks], [_fields(entry) for entry in recompiles]
        lines = [f"graph break at {entry.get('file')}:{entry.get('line')}: {entry.get('reason')} ({entry.get('count')}x)"
                 for entry in breaks]
        lines += [f"recompiled {entry.get('frame')} ({entry.get('file')}:{entry.get('line')}) {entry.get('count')}x for "
                  f"{entry.get('guard')}" for entry in recompiles]
        if lines:
            self._writer.add_text("compile", "  \n".join(lines), step)

    def write_rank_event(self, record: dict[str, Any]) -> None:
        """A ``straggler`` or ``hang`` (its journal record) at its step, as a line of the ``ranks`` text, in the words
        the app's log and headless say it."""
        event = rank_event(record)
        if isinstance(event, Straggler):
            self._writer.add_text("ranks", straggler_sentence(event), event.step)
        elif isinstance(event, Hang):
            self._writer.add_text("ranks", hang_sentence(event), event.step)

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
        """Write what is queued and close the file; the OSError of a write that failed (a full disk)."""
        self._writer.close()


def _fields(entry: Any) -> dict[str, Any]:
    """A break's or recompile's fields: the live event's payload objects, or a journal line's objects."""
    if isinstance(entry, dict):
        return entry
    return dataclasses.asdict(entry) if dataclasses.is_dataclass(entry) and not isinstance(entry, type) else {}


class LiveTensorBoard(TrainerObserver):
    """``--tensorboard DIR`` while training: what the trainer reports is queued (a deque append on the training
    thread) and written on a thread of this observer's own; closed when the run ends."""

    def __init__(self, directory: Path) -> None:
        summary_writer_class(directory)  # not installed: said before training starts
        refuse_an_unfit_tensorboard_folder(directory)  # and a folder someone else may change (the module's docstring)
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
                make_tensorboard_folder(self.directory)
                try:  # a resumed run hides what an earlier process wrote after the step it resumed at
                    self.writer = TensorBoardWriter(self.directory, purge_step=event.step + 1 if event.step else None)
                except OSError as error:
                    raise ConfigError(f"--tensorboard {self.directory}: cannot be written: {reason(error)}; give "
                                      "another --tensorboard, or free some space.") from None
                return
            case p.OptionApplied() | events.ResumeChangedSettings():  # the one reading of a change: option_history
                self._queue.extend(changes_recorded(event.journal_record()))
                if self.writer is None:  # a resume's changes come before run_started: written with the first row
                    return
            case p.ProfileReady() if not event.error:
                self._queue.append(event)
            case CompileReport() | Straggler() | Hang():
                self._queue.append(event.journal_record())
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
        try:
            self._write_until_closed()
        except OSError as error:  # a full disk: the event files end here, the run trains on
            self._closing = True  # nothing more is queued
            self._queue.clear()
            print(f"torchlab: TensorBoard's event files in {self.directory} stop here: {reason(error)}; training goes "
                  "on, and its metrics.jsonl has every row (torchlab-tui export --tensorboard writes them later).",
                  file=sys.stderr)
            try:
                self.writer.close()
            except OSError:  # the same failure again, said above
                pass

    def _write_until_closed(self) -> None:
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
                    case dict() if item.get("event") == CompileReport.journal_event():  # the journal's record
                        self.writer.write_compile_report(item)
                    case dict():  # a straggler's or a hang's journal record
                        self.writer.write_rank_event(item)
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
