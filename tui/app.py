"""The workbench app: a live view of a training run in another process, and the keys that steer it.

Data flow, one direction per arrow and one thread for the UI:

    link (reader thread, owned by the link) ──buffer──▶ 20 Hz timer: link.drain() ──▶ RunState.apply_all()
                                                                   └──▶ widgets redraw what changed

Only the timer and key handlers touch widgets; nothing blocks the UI on the trainer (measured in
shared/textual-notes.md: a buffer drained by a timer absorbs 100k+ records/s, per-message posting
backs up). Commands go out through ``link.send``, which never blocks. Every change the user asks for
is logged as requested at once, then acknowledged with the step it took effect at (or refused with
the trainer's reason) when the answer arrives; a prompt submitted with the value it showed sends nothing and
says so. Keys typed after the one that opens a prompt are the prompt's, however fast they come, and each key
of the main screen acts when it arrives, in the order typed (``app_keys.MainScreen``).

The app is one class written in four modules, one job each: this one holds its state, the link and the
drawing; ``app_keys`` its key table and main screen; ``app_actions`` what the keys do and ``send``;
``app_leaving`` quitting, detaching, a hang-up and the exit status.

A trainer that cannot start, or a run that fails, opens the error screen. torchlab's own refusals (a
TorchlabError: a runtime directory, a full disk) and the machine's (an OSError) are shown as their paragraph;
only an error that is neither, a bug, comes with its traceback. The app exits as a headless run would
(core/errors.py's codes): 2 for input the trainer or this app refused, 1 for a run that failed.

This module and everything it imports stays free of torch: the app must start in well under a second
over SSH. A subprocess test and an import-linter contract hold that line.
"""

from __future__ import annotations

import asyncio
import gc
import signal
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from textual import events, on, work
from textual.app import App, ComposeResult
from textual.css.query import NoMatches
from textual.message import Message
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer

from torchlab.core.errors import EXIT_FAILED, TorchlabError, exit_status
from torchlab.core.safe_open import UnsafeFileError
from torchlab.core.wire import protocol
from torchlab.core.options import format_option_value
from torchlab.core.wire.run_status import RunStatus
from torchlab.tui.app_actions import KeyActions
from torchlab.tui.app_keys import MainScreen
from torchlab.tui.app_leaving import Leaving
from torchlab.tui.app_notices import Notices
from torchlab.tui.key_order import as_typed
from torchlab.tui.log_levels import EntryLevel
from torchlab.tui.log_tail import LogTail, is_native_torch_log
from torchlab.tui.run_history import RunHistory, journal_history
from torchlab.tui.state import Failure, RunState
from torchlab.tui.widgets.charts import Charts
from torchlab.tui.widgets.event_log import EventLog
from torchlab.tui.widgets.grad_table import GradTable
from torchlab.tui.widgets.line_chart import LineChart
from torchlab.tui.widgets.options_panel import OptionsPanel
from torchlab.tui.widgets.rank_table import RankTable
from torchlab.tui.widgets.run_header import RunHeader
from torchlab.tui.widgets.stats_bar import StatsBar
from torchlab.tui.widgets.system_panel import SystemPanel

#: Below this width or height the layout drops borders and side panels (80x24 must read well).
COMPACT_WIDTH = 110
COMPACT_HEIGHT = 34
#: Each curve redraws at most this often (the figures in the header follow every poll), and at most
#: one chart per poll: at 50k reports a second, redrawing three charts on every poll cost more than
#: folding the reports in, and three in one frame made that frame the slowest of all.
CHART_REFRESH_S = 0.2
#: A poll folds reports for at most this long before it lets keys and frames in (then goes on).
FOLD_SLICE_S = 0.008
#: ... for this long: ``sleep(0)`` was not enough, a timer's wake-up takes more than one turn of the loop.
FOLD_PAUSE_S = 0.004
#: The run trains this long before the app asks its trainer what fits (tui/screens/fits_screen.py) on its own, for
#: its keys to say what a change will take: its first seconds (a compile, warm-up) are left to it, and a short run
#: never starts the forecaster's process. The "what fits" view asks at once.
FORECAST_AFTER_S = 30.0
#: The garbage collector's thresholds. With the default (700, 10, 10) full collections paused the event
#: loop for 50-90 ms at 50k reports a second. What is left to collect is mostly Textual's strips (their
#: caches hold themselves); a young generation of 50k took 27-57 ms a collection, of 20k 15-28 ms.
GC_THRESHOLDS = (20_000, 10, 100)


class LinkLike(Protocol):
    """What the app needs from its connection to the trainer (``torchlab.tui.link.TrainerLink``)."""

    run_dir: Path | None
    log_path: Path | None

    def start(self) -> None: ...
    def drain(self) -> list[protocol.Message]: ...
    def send(self, command: protocol.Message) -> None: ...
    def close(self, *, detach: bool = False) -> None: ...
    def restart(self, resume: bool, options: dict[str, Any] | None = None) -> None: ...
    def restart_point(self) -> str | None: ...
    def detach_and_wait(self, timeout_s: float) -> bool: ...

    @property
    def trainer_exit_code(self) -> int | None: ...


LinkFactory = Callable[[], LinkLike]


@dataclass
class HistoryRead(Message):
    """A resumed run's journals, read off the UI thread: its history, or why it could not be read."""

    history: RunHistory | None
    error: str = ""


class TorchlabApp(Notices, KeyActions, Leaving, App[int]):
    """The live workbench (the CLI, attach, serve and the tests build it the same way)."""

    CSS_PATH = "app.tcss"
    TITLE = "torchlab-tui"
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (COMPACT_WIDTH, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (COMPACT_HEIGHT, "-tall")]

    def __init__(
        self,
        link: LinkLike | LinkFactory,
        *,
        workload: str | None = None,
        poll_interval: float = 0.05,
        log_poll_interval: float = 0.5,
        grad_refresh_interval: float = 0.5,
        forecast_after_s: float | None = FORECAST_AFTER_S,
    ) -> None:
        """The app as users get it: the CLI passes a factory of the real link, the tests a fake one.

        ``link`` is a link instance or a zero-argument factory; the app calls the factory and then ``start()`` from
        the main thread when it mounts, so the window shows before the trainer exists. ``workload`` is shown in the
        header until the trainer's welcome names it. The intervals are the drain timer, the trainer.log tail, and the
        least time between gradient-table updates; tests set them so that nothing happens unless they call
        ``poll_now``. ``forecast_after_s``: how long the run trains before the app asks what fits on its own (None:
        only when the "what fits" view opens)."""
        super().__init__()
        self.grad_refresh_interval = grad_refresh_interval
        # A link instance has drain(); anything else is the factory that makes one.
        self._link_factory: LinkFactory = (lambda: link) if hasattr(link, "drain") else link  # type: ignore[assignment,return-value]
        self.link: LinkLike | None = None
        self.run_state = RunState(workload)
        self.poll_interval = poll_interval
        self.log_poll_interval = log_poll_interval
        self._log_tail: LogTail | None = None
        self._seen = {"header": -1, "metrics": -1, "options": -1, "failure": 0, "telemetry": -1, "ranks": -1}
        self._compact = False
        self._ranks_shown: bool | None = None
        self._link_closed = False
        self._leaving = False
        self._error_screen_open = False
        #: the status to exit with when the trainer could not be started (None: it was, or it is yet to be)
        self._start_failed_status: int | None = None
        self._hangup_thread: threading.Thread | None = None
        #: per chart: the state's metrics version it shows and when it was drawn
        self._chart_drawn: dict[LineChart, tuple[int, float]] = {}
        #: drained from the link, not yet folded into the state (a poll folds in slices)
        self._unfolded: deque[protocol.Message] = deque()
        #: (option, value) a key's cycle skipped as this run would refuse it, and said why (once)
        self._skips_said: set[tuple[str, Any]] = set()
        #: a change predicted not to fit, refused once: asked for again, it is sent (``set_option``)
        self._confirming: tuple[str, Any] | None = None
        #: the run trains this long (seconds) before the app asks what fits on its own (None: only its view asks)
        self.forecast_after_s = forecast_after_s
        self._training_since: float | None = None

    # ------------------------------------------------------------------ layout

    def get_default_screen(self) -> Screen:
        """The screen ``compose`` fills: it holds the workbench's keys (``MainScreen``)."""
        return MainScreen(id="_default")

    def compose(self) -> ComposeResult:
        state = self.run_state
        yield RunHeader(id="header")
        yield StatsBar(id="stats")
        with Horizontal(id="main"):
            yield Charts(state, id="charts")
            with Vertical(id="side"):
                yield GradTable(refresh_interval=self.grad_refresh_interval, id="grads")
                yield RankTable(id="ranks")  # above world size 1, on a large terminal
        with Horizontal(id="bottom"):
            yield OptionsPanel(id="options")
            yield SystemPanel(id="system")
            yield RankTable(compact=True, id="ranks-line")  # above world size 1, on a small terminal
            yield EventLog(id="events")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#grads").border_title = "gradient norms"
        self.query_one("#options").border_title = "options"
        self.query_one("#system").border_title = "system"
        self.query_one("#events").border_title = "events"
        self._set_compact(self.size.width, self.size.height)
        self._refresh_view()
        self.query_one("#grad-data").focus()
        self._start_link()
        self.set_interval(self.poll_interval, self._poll_in_slices)
        self.poll_now()  # whatever the link has already (a fake link: everything) shows in the first frame
        self.set_interval(self.log_poll_interval, self._poll_trainer_log)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGHUP, self._on_hangup)

    def on_resize(self, event: events.Resize) -> None:
        self._set_compact(event.size.width, event.size.height)

    def _set_compact(self, width: int, height: int) -> None:
        compact = width < COMPACT_WIDTH or height < COMPACT_HEIGHT
        self._compact = compact
        self.query_one(OptionsPanel).compact = compact
        self.query_one(SystemPanel).compact = compact
        self.query_one(Footer).compact = width < COMPACT_WIDTH  # so "? Help" still fits in 80 columns
        self._ranks_shown = None  # placed again for this size
        self._show_ranks(self.run_state)

    # ------------------------------------------------------------------ the link

    def _start_link(self) -> None:
        """Create and start the link; a failure shows the error screen, it does not end the app."""
        try:
            self.link = self._link_factory()
            self.link.start()
        except Exception as error:  # the user's config or machine: shown, never fatal
            self._trainer_did_not_start(error)
            return
        self._start_failed_status = None
        self._link_closed = False
        self.run_state.read_only = self.read_only
        self.run_state.attaching = bool(getattr(self.link, "attached", False))
        self._follow_trainer_log()

    def _follow_trainer_log(self) -> None:
        path = getattr(self.link, "log_path", None)
        if path is not None and (self._log_tail is None or self._log_tail.path != Path(path)):
            self._log_tail = LogTail(Path(path), start=getattr(self.link, "log_start", 0))

    def poll_now(self) -> None:
        """Take what the link buffered, fold all of it into the state, redraw what changed (start-up, tests)."""
        self._take_from_link()
        self.run_state.apply_all(self._unfolded)
        self._unfolded.clear()
        self._redraw()

    async def _poll_in_slices(self) -> None:
        """The 20 Hz heartbeat: as ``poll_now``, folding at most FOLD_SLICE_S at a time.

        Between slices the event loop runs: a key press or a frame waits for one slice, not for a
        whole burst (an attach replays 20k reports; at 100k reports/s one poll held 60 ms of them).
        """
        self._take_from_link()
        while True:
            self.run_state.apply_all(self._unfolded_until(time.perf_counter() + FOLD_SLICE_S))
            self._redraw()
            if not self._unfolded:
                return
            await asyncio.sleep(FOLD_PAUSE_S)

    def _unfolded_until(self, deadline: float) -> Iterator[protocol.Message]:
        """Drained events, oldest first, until none is left or the deadline has passed (at least one)."""
        unfolded = self._unfolded
        while unfolded:
            yield unfolded.popleft()
            if time.perf_counter() >= deadline:
                return

    def _take_from_link(self) -> None:
        if self.link is not None and not self._link_closed:
            try:
                self._unfolded.extend(self.link.drain())
            except Exception as error:  # a broken link is reported, and the app stays up to say so
                self.run_state.log(EntryLevel.ERROR, f"lost the connection to the trainer: {error}", notify=True)
        self._forecast_once_settled()

    def _redraw(self) -> None:
        try:
            self._refresh_view()
        except NoMatches:  # a tick that fires while the app exits finds its widgets already removed
            if self.is_running and not self._leaving:
                raise

    def _poll_trainer_log(self) -> None:
        if self._log_tail is None:
            self._follow_trainer_log()
        if self._log_tail is None:
            return
        try:
            lines = self._log_tail.read_lines()
        except (OSError, UnsafeFileError) as error:
            self.run_state.log(EntryLevel.WARNING, f"cannot read {self._log_tail.path}: {error}")
            self._log_tail = None
            return
        for line in lines:
            if line.strip() and not is_native_torch_log(line):
                self.run_state.log(EntryLevel.TRAINER, line)

    @property
    def read_only(self) -> bool:
        """A viewer (``attach --view``): it watches the run beside the app that controls it."""
        return bool(getattr(self.link, "view", False))


    # ------------------------------------------------------------------ drawing

    def _refresh_view(self) -> None:
        state = self.run_state
        if state.header_version != self._seen["header"]:
            self._seen["header"] = state.header_version
            self.query_one(RunHeader).show(state)
            self.query_one(StatsBar).show(state)
        if state.metrics_version != self._seen["metrics"]:
            self.query_one(Charts).show()
            self._redraw_a_chart(state)
        self.query_one(GradTable).show(state)
        if state.options_version != self._seen["options"]:
            self._seen["options"] = state.options_version
            self.query_one(OptionsPanel).show(state)
        if state.telemetry_version != self._seen["telemetry"]:
            self._seen["telemetry"] = state.telemetry_version
            self.query_one(SystemPanel).show(state)
        self._show_ranks(state)
        # A view on top (profiles, impact, system) follows the state too, once mounted (its on_mount draws
        # it first); it redraws only what moved.
        show_state = getattr(self.screen, "show_state", None)
        if show_state is not None and self.screen.is_mounted:
            show_state(state)
        event_log = self.query_one(EventLog)
        for entry in state.take_log():
            event_log.add(entry)
            # Failures have their own screen; a notice on top of it would only cover its buttons.
            if entry.notify and entry.level != EntryLevel.ERROR:
                self.show_notice(entry.toast or entry.text, entry.level)
        if state.failure is not None and state.failure_version != self._seen["failure"]:
            self._seen["failure"] = state.failure_version
            self._show_failure(state.failure)
        if state.detached and not self._leaving:
            self._leave(detach=True)
        if state.history_wanted is not None:
            self._read_history(Path(state.history_wanted))
            state.history_wanted = None

    @work(thread=True, exclusive=True, exit_on_error=False, group="history")
    def _read_history(self, run_dir: Path) -> None:
        """A resumed run's journals hold its earlier steps: read them off the UI thread (megabytes on a long run)."""
        try:
            self.post_message(HistoryRead(journal_history(run_dir)))
        except TorchlabError as error:
            self.post_message(HistoryRead(None, str(error)))

    @on(HistoryRead)
    def _history_read(self, message: HistoryRead) -> None:
        if message.history is not None:
            self.run_state.take_history(message.history)
        elif message.error:
            self.run_state.log(EntryLevel.WARNING, f"the run's earlier steps are not shown: {message.error}")
        self._redraw()

    def _redraw_a_chart(self, state: RunState) -> None:
        """Redraw the chart drawn longest ago, if it is behind the state and was drawn CHART_REFRESH_S ago."""
        now = time.monotonic()
        behind = []
        for chart in self.query(LineChart):
            version, drawn_at = self._chart_drawn.get(chart, (-1, -CHART_REFRESH_S))
            if version != state.metrics_version:
                behind.append((drawn_at, chart))
        if not behind:
            self._seen["metrics"] = state.metrics_version
            return
        drawn_at, chart = min(behind, key=lambda item: item[0])
        if now - drawn_at >= CHART_REFRESH_S:
            self._chart_drawn[chart] = (state.metrics_version, now)
            chart.data_changed()

    def _show_ranks(self, state: RunState) -> None:
        """The rank table (large terminal) or its summary line (small one), only above world size 1."""
        shown = state.has_ranks
        if shown != self._ranks_shown:
            self._ranks_shown = shown
            self.query_one("#ranks", RankTable).display = shown and not self._compact
            self.query_one("#ranks-line", RankTable).display = shown and self._compact
            self._seen["ranks"] = -1
        if shown and state.ranks_version != self._seen["ranks"]:
            self._seen["ranks"] = state.ranks_version
            self.query_one("#ranks", RankTable).show(state)
            self.query_one("#ranks-line", RankTable).show(state)

    def _trainer_did_not_start(self, error: Exception) -> None:
        """The error screen for a trainer that could not be started, and the status the app will exit with."""
        if isinstance(error, TorchlabError):  # torchlab's refusal: its paragraph says what to do
            failure, self._start_failed_status = Failure(RunStatus.FAILED, str(error), "", None), exit_status(error)
        elif isinstance(error, OSError):  # the machine's (a full disk, no permission): it names the file
            failure, self._start_failed_status = Failure(RunStatus.FAILED, f"could not start the trainer: {error}", "", None), EXIT_FAILED
        else:  # a bug: its traceback is what to report
            failure = Failure(RunStatus.FAILED, f"could not start the trainer: {error}", traceback.format_exc(), None)
            self._start_failed_status = EXIT_FAILED
        self._show_failure(failure)

    def _show_failure(self, failure: Failure) -> None:
        if self._error_screen_open:
            return
        self._error_screen_open = True
        from torchlab.tui.screens.error_screen import ErrorScreen  # screens load when first shown: a faster start

        restart_from = self.link.restart_point() if self.link is not None else None
        # Options for the restart only where there is a trainer to restart (not one that could not start).
        options = dict(self.run_state.options) if self.link is not None else None
        self.push_screen(ErrorScreen(failure, restart_from, options, self.run_state.skips), callback=self._failure_choice)

    def _failure_choice(self, choice: object) -> None:
        from torchlab.tui.screens.error_screen import CLOSE, QUIT, Restart

        self._error_screen_open = False
        if isinstance(choice, Restart):
            # What the screen showed is what the restart trains with: an option changed after the checkpoint
            # is told too, as the checkpoint holds its earlier value.
            self.restart_trainer({**self.run_state.changed_since_checkpoint(), **choice.options})
        elif choice == QUIT:
            self._leave(detach=False)
        elif choice == CLOSE:
            self.run_state.log(EntryLevel.INFO, "q quits; ctrl+p → Restart sets options and resumes the run")
            self._refresh_view()

    def restart_trainer(self, options: dict[str, Any] | None = None) -> None:
        """Start a new trainer that resumes from the run's last checkpoint (after a failure), with ``options``
        (set on the error screen) in force from its first step.

        On the main thread on purpose: the link's ``start`` must be (the trainer's parent-death signal
        follows the thread that spawned it), and the old trainer has already ended.
        """
        if self.link is not None and self.run_state.state in (RunStatus.RUNNING, RunStatus.PAUSED, RunStatus.STARTING, RunStatus.RELAUNCHING):
            self.notify("the run is still going: restart is for a run that failed or stopped", severity="warning")
            return
        options = options or {}
        given = ", ".join(f"{name} = {format_option_value(name, value)}" for name, value in options.items())
        self.run_state.log(EntryLevel.INFO, f"restarting the trainer from the last checkpoint{' with ' + given if given else ''}…",
                           notify=True)
        if self.link is None:
            self._start_link()
        else:
            try:
                self.link.restart(resume=True, options=options)
            except Exception as error:  # shown on the error screen again
                self._trainer_did_not_start(error)
                return
            self._start_failed_status = None
            self._link_closed = False
            self._follow_trainer_log()
        self.run_state.mark_restarting()
        self._refresh_view()

    # ------------------------------------------------------------------ keys

    async def on_event(self, event: events.Event) -> None:
        if isinstance(event, events.Key) and not event.is_forwarded:  # as it arrives, before Textual routes it
            for key in as_typed(event, self.screen.active_bindings):
                await super().on_event(key)
            return
        await super().on_event(event)

    @on(GradTable.ViewChanged)
    def _grad_view_changed(self, event: GradTable.ViewChanged) -> None:
        self.notify(event.description, timeout=2)


def tune_garbage_collection() -> None:
    """For a process that runs the app and nothing else (the CLI's): see ``GC_THRESHOLDS``.

    What was built so far lives as long as the process, so it is frozen out of every collection. The
    CLI keeps the collector off while it imports the app (~57k objects, all kept: collecting among
    them cost ~40 ms of a 0.35 s import); frozen first, they are not scanned when it comes back on.
    Not done in the app itself: a process that makes many apps (the tests) would freeze their garbage.
    """
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    gc.enable()
