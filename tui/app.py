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
of the main screen acts when it arrives, in the order typed (``MainScreen``).

A trainer that cannot start, or a run that fails, opens the error screen. torchlab's own refusals (a
TorchlabError: a runtime directory, a full disk) and the machine's (an OSError) are shown as their paragraph;
only an error that is neither, a bug, comes with its traceback. The app exits as a headless run would
(core/wire/errors.py's codes): 2 for input the trainer or this app refused, 1 for a run that failed.

This module and everything it imports stays free of torch: the app must start in well under a second
over SSH. A subprocess test and an import-linter contract hold that line.
"""

from __future__ import annotations

import asyncio
import errno
import gc
import os
import signal
import sys
import termios
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from textual import events, on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.message import Message
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen, Screen
from textual.widgets import Footer

from torchlab.core.wire import protocol
from torchlab.core.wire.config import DEFAULT_PROFILE_STEPS
from torchlab.core.wire.errors import EXIT_FAILED, EXIT_NONFINITE, EXIT_OK, EXIT_USAGE, TorchlabError, exit_status
from torchlab.core.wire.options import (
    CHECKPOINTING,
    LIVE_OPTIONS,
    OPTIONS_BY_NAME,
    Number,
    OptionRefused,
    format_option_value,
)
from torchlab.core.wire.run_status import RunStatus
from torchlab.core.wire.safe_open import UnsafeFileError
from torchlab.core.wire.trials import TRIAL_HINT, parse_trial
from torchlab.tui.key_order import as_typed
from torchlab.tui.log_tail import LogTail, is_native_torch_log
from torchlab.tui.names import describe_blocks
from torchlab.tui.run_history import RunHistory, journal_history
from torchlab.tui.state import Failure, RunState
from torchlab.tui.widgets.event_log import EventLog
from torchlab.tui.widgets.grad_table import GradTable
from torchlab.tui.widgets.charts import SPEED, Charts
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
#: The garbage collector's thresholds. With the default (700, 10, 10) full collections paused the event
#: loop for 50-90 ms at 50k reports a second. What is left to collect is mostly Textual's strips (their
#: caches hold themselves); a young generation of 50k took 27-57 ms a collection, of 20k 15-28 ms.
GC_THRESHOLDS = (20_000, 10, 100)
#: After a hang-up, how long the app waits for the trainer to acknowledge the detach before it goes.
HANGUP_DETACH_TIMEOUT_S = 3.0


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


@dataclass(frozen=True)
class KeyAction:
    """One key of the workbench: binding, footer label, help and command-palette text in one place."""

    key: str
    action: str
    label: str
    help: str
    show: bool = True
    key_display: str | None = None


KEY_ACTIONS = (
    KeyAction("space", "toggle_pause", "Pause", "Pause or resume training", key_display="space"),
    *(KeyAction(o.key, f"change_option('{o.name}')", o.footer, o.help, show=o.in_footer)
      for o in LIVE_OPTIONS),
    KeyAction("p", "profile", "Profile", f"Profile the next {DEFAULT_PROFILE_STEPS} steps", show=False),
    KeyAction("P", "profiles", "Profiles", "Profiles: list the snapshots, open a table, compare two", show=False),
    KeyAction("i", "impact", "Impact", "Impact table: what each option change cost or saved", show=False),
    KeyAction("t", "system", "System", "System: every GPU, host CPU/RAM, trainer memory and its history", show=False),
    KeyAction("T", "try_option", "Trial", "Trial: try an option for a few steps on the same batches, then undo it", show=False),
    KeyAction("f", "next_chart", "Chart", "Chart: samples/s or one of the workload's own metrics, in turn", show=False),
    KeyAction("M", "memory", "Memory", "Memory by kind: parameters, gradients, optimizer state, activations by module", show=False),
    KeyAction("s", "save_checkpoint", "Save", "Save a checkpoint now"),
    KeyAction("d", "detach", "Detach", "Leave the app; the trainer keeps training (reattach later)", show=False),
    KeyAction("q", "quit", "Quit", "Quit: stop the trainer after a final checkpoint"),
    KeyAction("question_mark", "help", "Help", "Show every key", key_display="?"),
)

#: Actions that talk to the trainer: not while a dialog is open (the palette opened over one; the keys that run
#: them are ``MainScreen``'s, and act only while it is on top).
TRAINER_ACTIONS = frozenset(
    {"toggle_pause", "change_option", "profile", "save_checkpoint", "detach", "try_option"}
)
#: Actions that open a view: from the main screen only, so views do not pile up on each other.
VIEW_ACTIONS = frozenset({"profiles", "impact", "system", "memory"})


class MainScreen(Screen[None]):
    """The workbench's screen: its keys (``KEY_ACTIONS``) act on the app, and only while it is on top.

    Each key is bound with priority, so it acts when it arrives, before the key typed after it is routed: keys
    come together when typed fast, and a key without priority is looked up only once it has bubbled up from the
    focused widget. By then the ``m`` after it, which opens a prompt when it arrives (``prompt.open_prompt``),
    had covered this screen, and ``a m 2 Enter`` set accum and lost the ``a``. The keys are this screen's, not
    the app's, because Textual looks a priority binding up from the screen on top: a dialog or view pushed over
    this one (help, a prompt, the error screen, the palette) keeps its own keys (``q`` closes help), where app
    bindings with priority would take them before it, and ctrl+q (the app's) still quits from anywhere. A focused
    text field (the gradient filter) still takes them as text: Textual leaves a key an Input consumes to it.
    A view closes as its closing key arrives too (``view_screen.OverlayScreen``), so in ``i i s`` typed fast the
    ``s`` arrives with this screen back on top.
    """

    BINDINGS = [
        Binding(k.key, f"app.{k.action}", k.label, show=k.show, key_display=k.key_display, tooltip=k.help, priority=True)
        for k in KEY_ACTIONS
    ]


@dataclass
class HistoryRead(Message):
    """A resumed run's journals, read off the UI thread: its history, or why it could not be read."""

    history: RunHistory | None
    error: str = ""


class TorchlabApp(App[int]):
    """The live workbench. Build it with ``make_app`` (the CLI and the tests both do)."""

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
    ) -> None:
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
                self.run_state.log("error", f"lost the connection to the trainer: {error}", notify=True)

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
            self.run_state.log("warning", f"cannot read {self._log_tail.path}: {error}")
            self._log_tail = None
            return
        for line in lines:
            if line.strip() and not is_native_torch_log(line):
                self.run_state.log("trainer", line)

    @property
    def read_only(self) -> bool:
        """A viewer (``attach --view``): it watches the run beside the app that controls it."""
        return bool(getattr(self.link, "view", False))

    def _refuse_in_view(self, subject: str) -> bool:
        """True, said at once, when this app is a read-only view (before a prompt asks for a value that would
        go nowhere)."""
        if not self.read_only:
            return False
        self.run_state.log("refused", f"{subject}: read-only view (the controlling app changes the run)",
                           notify=True)
        self._refresh_view()
        return True

    def send(self, command: protocol.Message) -> bool:
        """Send a command to the trainer; False (and a message saying why) when there is no trainer to send to."""
        if self._refuse_in_view(_command_subject(command)) or self._run_has_ended(_command_subject(command)):
            return False
        if self.link is None or self._link_closed:
            self.run_state.log("refused", f"{_command_subject(command)}: no trainer is connected", notify=True)
            self._refresh_view()
            return False
        if self.run_state.state == RunStatus.CONNECTING:
            # Before the welcome the trainer is still importing torch; the link would answer with an error.
            self.run_state.log("refused", f"{command.type}: the trainer is still starting; try again in a moment", notify=True)
            self._refresh_view()
            return False
        try:
            self.link.send(command)
        except Exception as error:  # told to the user; the app goes on
            self.run_state.log("error", f"could not send {command.type} to the trainer: {error}", notify=True)
            self._refresh_view()
            return False
        return True

    def _run_has_ended(self, subject: str) -> bool:
        """True, said at once as space says it, when no trainer is left to answer (the link would only say
        later that nothing is connected, after the app had logged the request as sent)."""
        ended = self.run_state.ended
        if ended is None:
            return False
        self.run_state.log("refused", f"{subject}: {ended}; nothing was sent", notify=True)
        self._refresh_view()
        return True

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
            # Failures have their own screen; a toast on top of it would only cover its buttons.
            if entry.notify and entry.level != "error":
                severity = "warning" if entry.level == "refused" else "information"
                self.notify(entry.toast or entry.text, severity=severity, timeout=4, markup=False)
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
            self.run_state.log("warning", f"the run's earlier steps are not shown: {message.error}")
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
        self.push_screen(ErrorScreen(failure, restart_from, options, self.run_state.was_refused), callback=self._failure_choice)

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
            self.run_state.log("info", "q quits; ctrl+p → Restart sets options and resumes the run")
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
        self.run_state.log("info", f"restarting the trainer from the last checkpoint{' with ' + given if given else ''}…",
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

    # ------------------------------------------------------------------ actions

    async def on_event(self, event: events.Event) -> None:
        if isinstance(event, events.Key) and not event.is_forwarded:  # as it arrives, before Textual routes it
            for key in as_typed(event, self.screen.active_bindings):
                await super().on_event(key)
            return
        await super().on_event(event)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if (action in TRAINER_ACTIONS or action in VIEW_ACTIONS) and isinstance(self.screen, ModalScreen):
            return False
        if action in TRAINER_ACTIONS and self.read_only:  # a viewer's footer lists only the keys that work for it
            return False
        return True

    def action_toggle_pause(self) -> None:
        state = self.run_state.state
        if state == RunStatus.PAUSED:
            if self.send(protocol.ResumeCommand()):
                self._requested("resume requested")
        elif state in (RunStatus.RUNNING, RunStatus.STARTING, RunStatus.RELAUNCHING):  # while relaunching: the new ranks start paused
            if self.send(protocol.PauseCommand()):
                self._requested("pause requested (takes effect at the end of the current step)")
        else:
            why = self.run_state.ended or f"the run is {state}"
            self.notify(f"{why}: there is nothing to pause or resume", severity="warning")

    async def action_change_option(self, name: str) -> None:
        """An option's key: the next value of a mode or a switch, or a prompt for a number."""
        option = OPTIONS_BY_NAME[name]
        if self._refuse_in_view(name) or self._run_has_ended(name):  # before a prompt asks for a value that would go nowhere
            return
        current = self.run_state.option(name)
        if not isinstance(option, Number):
            self._next_value(name, current)
            return

        from torchlab.tui.screens.prompt import Chosen, OptionPrompt, open_prompt

        def chosen(answer: Chosen | None) -> None:
            if answer is None:
                return
            if answer.value == current:  # Enter on the value shown: "applied (was 1)" would say a change was made
                self._requested(f"{name} stays {format_option_value(name, current)}: nothing sent")
            else:
                self.set_option(name, answer.value)

        def parse(text: str) -> Any:  # as the option parses it, then what this run would refuse, with the reason
            value = option.parse(text)
            reason = self.run_state.would_refuse(name, value)
            if reason is not None:
                raise OptionRefused(reason)
            return value

        await open_prompt(self, OptionPrompt(option.prompt, option.hint, parse, current=option.shown_in_prompt(current)),
                          chosen)

    def _next_value(self, name: str, current: Any) -> None:
        """A mode's key cycles past the values this run would refuse or has refused (saying why once for each); a
        switch turned to a value the run would refuse says why and sends nothing."""
        option = OPTIONS_BY_NAME[name]
        state = self.run_state

        def refused(value: Any) -> bool:
            return state.was_refused(name, value) or state.would_refuse(name, value) is not None

        value = option.next_value(current, refused)
        reason = state.would_refuse(name, value)
        if reason is not None:
            state.log("refused", f"{name} = {option.format(value)} refused: {reason} (nothing sent)", notify=True)
            self._refresh_view()
            return
        self._say_why_skipped(name, current, value)
        self.set_option(name, value)

    def _say_why_skipped(self, name: str, current: Any, chosen: Any) -> None:
        """Once a run, for each value a key's cycle skipped between ``current`` and ``chosen`` because the run would
        refuse it: a key that silently passes a mode by reads as a key that does not know the mode."""
        option = OPTIONS_BY_NAME[name]
        candidate = option.next_value(current, lambda value: False)
        while candidate != chosen:
            reason = self.run_state.would_refuse(name, candidate)
            if reason is not None and (name, candidate) not in self._skips_said:
                self._skips_said.add((name, candidate))
                self.run_state.log("info", f"{name}: {option.format(candidate)} skipped: {reason}")
            candidate = option.next_value(candidate, lambda value: False)

    async def action_try_option(self) -> None:
        """A controlled trial: OPTION=VALUE [STEPS] typed, checked, and sent; the result comes to the log."""
        from torchlab.tui.screens.prompt import Chosen, OptionPrompt, open_prompt

        if self._refuse_in_view("trial") or self._run_has_ended("trial"):
            return

        def chosen(answer: Chosen | None) -> None:
            if answer is not None and self.send(answer.value):
                command = answer.value
                self._requested(f"trial of {command.option} = {command.value} for {command.steps} steps requested "
                                f"(from the next step boundary; training waits for it)")

        await open_prompt(self, OptionPrompt("Try an option for a few steps, then undo it", TRIAL_HINT, parse_trial), chosen)

    def set_option(self, option: str, value: Any) -> None:
        """Ask the trainer to change a live option at the next step boundary."""
        if self.send(protocol.SetCommand(option, value)):
            self.run_state.note_request(option, value)
            self._refresh_view()

    def action_next_chart(self) -> None:
        shown = self.query_one(Charts).next_chart()
        if shown == SPEED and not self.run_state.workload_metrics:  # in the log too: a toast alone read as nothing done
            self.run_state.log("info", "chart: the workload reports no metrics of its own: return {\"loss\": ..., "
                               "\"accuracy\": ...} from loss_fn to chart them", notify=True, toast="no workload metrics to chart")
            self._refresh_view()

    def action_profile(self) -> None:
        if self.send(protocol.ProfileCommand(steps=DEFAULT_PROFILE_STEPS)):
            self.run_state.note_profile_request()
            self._requested(f"profiler snapshot of the next {DEFAULT_PROFILE_STEPS} steps requested")

    def action_save_checkpoint(self) -> None:
        if self.send(protocol.SaveCheckpointCommand()):
            self._requested("checkpoint requested (saved at the end of the current step)")

    def action_detach(self) -> None:
        self.run_state.detach_requested = True
        if self.send(protocol.DetachCommand()):
            self._requested("detach requested: the app leaves once the trainer confirms")

    # The views are imported when first opened: they are not part of the first frame (start-up time).

    def action_profiles(self) -> None:
        from torchlab.tui.screens.profile_screens import ProfileListScreen

        self.push_screen(ProfileListScreen(self.run_state))

    def action_impact(self) -> None:
        from torchlab.tui.screens.impact_screen import ImpactScreen

        self.push_screen(ImpactScreen(self.run_state))

    def action_memory(self) -> None:
        from torchlab.tui.screens.memory_screen import MemoryScreen

        self.push_screen(MemoryScreen(self.run_state))

    def action_system(self) -> None:
        from torchlab.tui.screens.system_screen import SystemScreen

        self.push_screen(SystemScreen(self.run_state))

    async def action_quit(self) -> None:
        self._leave(detach=False)

    def action_help(self) -> None:
        blocks = self.run_state.checkpoint_blocks
        wraps = {CHECKPOINTING.key: f": {describe_blocks(blocks)}" if blocks else " (which ones: once the trainer has said)"}
        keys = [(k.key_display or k.key, k.help + wraps.get(k.key, "")) for k in KEY_ACTIONS
                if not (self.read_only and k.action.split("(")[0] in TRAINER_ACTIONS)]  # a viewer's keys only
        keys += [("/", "Filter the gradient table by module name (enter/esc back)"), ("o", "Cycle the gradient table's sort"),
                 ("v", "Grouped / per-module gradient view"), ("enter", "On a group: show its modules"),
                 ("ctrl+p", "Command palette")]
        from torchlab.tui.screens.help_screen import HelpScreen

        self.push_screen(HelpScreen(keys))

    def _requested(self, text: str) -> None:
        self.run_state.log("info", text)
        self._refresh_view()

    # ------------------------------------------------------------------ leaving

    def _leave(self, *, detach: bool) -> None:
        """Close the link off the UI thread (a final checkpoint can take seconds), then exit.

        A second ``q`` while the trainer is still saving exits at once; the link's own clean-up
        (the trainer's parent-death handling) still ends the trainer.
        """
        if self._leaving:
            self.exit(return_code=self.outcome_exit_code())
            return
        self._leaving = True
        if self.link is None or self._link_closed:
            self.exit(return_code=self.outcome_exit_code())
            return
        if self.read_only:  # a viewer leaves; the run goes on as it is
            self._close_link(True)
            return
        if detach:
            where = self.link.run_dir or self.run_state.run_dir
            self.notify(f"detached from {where}: {self.run_state.after_detach}")
        else:
            self.notify("stopping the trainer: saving a final checkpoint… (q again to leave at once)")
        self._close_link(detach)

    @work(exclusive=True, group="link-close", exit_on_error=False)
    async def _close_link(self, detach: bool) -> None:
        link = self.link
        self._link_closed = True
        try:
            if link is not None:
                # In a thread: the trainer's final checkpoint can take seconds, and the UI keeps drawing meanwhile.
                await asyncio.to_thread(link.close, detach=detach)
        except Exception as error:  # said on the way out: the terminal is all that is left to tell
            self.exit(1, 1, f"torchlab-tui: could not stop the trainer cleanly: {error}")
            return
        self.exit(return_code=self.outcome_exit_code())

    def outcome_exit_code(self) -> int:
        """The app's exit status tells how the run ended, as a headless run's does: 0 finished, stopped or
        detached; 1 failed (or its trainer could not be started: a full disk); 2 the trainer (or this app, before
        starting it) refused its input (a workload, a setting, the runtime directory); 3 non-finite."""
        state = self.run_state
        if state.detached or self.read_only:  # a viewer's leaving says nothing of the run
            return EXIT_OK
        if self._start_failed_status is not None:
            return self._start_failed_status
        if state.failure is None:
            return EXIT_OK
        if state.failure.kind == RunStatus.NONFINITE:
            return EXIT_NONFINITE
        if self.link is not None and self.link.trainer_exit_code == EXIT_USAGE:
            return EXIT_USAGE
        return EXIT_FAILED

    def on_unmount(self) -> None:
        # Any other way out (ctrl+c, an exception): the trainer still gets told, so no orphan is left;
        # unless the terminal is gone, which is a hang-up whichever noticed first: then it trains on.
        if self._hangup_thread is not None:
            self._hangup_thread.join(HANGUP_DETACH_TIMEOUT_S + 2.0)
        elif self.link is not None and not self._link_closed:
            if terminal_hung_up():
                self._detach_after_hangup()
            else:
                self._link_closed = True
                self.link.close(detach=False)

    # ------------------------------------------------------------------ hang-up

    def _on_hangup(self, signum: int, frame: object) -> None:
        """SIGHUP: the SSH connection dropped or the tmux pane was killed. Detach, then go.

        A signal handler takes no locks and touches no widget: a thread asks the trainer to go on.
        """
        if self._hangup_thread is None:
            self._hangup_thread = threading.Thread(target=self._detach_after_hangup, name="torchlab-hangup", daemon=True)
            self._hangup_thread.start()

    def _detach_after_hangup(self) -> None:
        link = self.link
        if link is not None and not self._link_closed:
            self._link_closed = True
            detached = link.detach_and_wait(HANGUP_DETACH_TIMEOUT_S)
            link.close(detach=detached)  # not acknowledged (an old trainer): it stops, as a quit would
        if terminal_hung_up():
            # No screen is left to restore, and Textual's goodbye to the terminal would block on it
            # forever: the trainer has its answer, so the app ends here.
            os._exit(0)
        try:
            self.call_from_thread(self.exit, 0)
        except RuntimeError:  # the app had already stopped
            pass

    # ------------------------------------------------------------------ command palette

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for key in KEY_ACTIONS:
            if key.action in ("quit", "help") or (self.read_only and key.action.split("(")[0] in TRAINER_ACTIONS):
                continue
            yield SystemCommand(key.help, f"key {key.key_display or key.key}", self._palette_callback(key.action))
        yield SystemCommand("Restart the trainer from the last checkpoint", "after a failure or a stop: resume the run",
                            self._restart_from_palette)
        yield SystemCommand("Compare with an earlier run of this workload", "the newest one before it, in the same runs folder",
                            self.compare_with_earlier_run)
        yield SystemCommand("Help: every key of the workbench", "key ?", self.action_help)

    def compare_with_earlier_run(self) -> None:
        """This run beside the newest earlier run of its workload (``torchlab-tui compare`` on the two)."""
        from torchlab.core.wire.errors import ConfigError
        from torchlab.tui.run_history import RunHistory, earlier_run
        from torchlab.tui.screens.compare_screen import CompareScreen

        here = Path(self.run_state.run_dir) if self.run_state.run_dir else None
        before = earlier_run(here) if here is not None else None
        if before is None:
            where = here.parent if here is not None else "its runs folder"
            self.notify(f"no earlier run of this workload in {where} to compare with", severity="warning")
            return
        try:
            runs = [RunHistory.load(before), RunHistory.load(here)]
        except ConfigError as error:
            self.notify(str(error), severity="warning")
            return
        self.push_screen(CompareScreen(runs))

    def _restart_from_palette(self) -> None:
        """After a failure, the error screen again (its options go with the restart); else restart at once."""
        failure = self.run_state.failure
        if failure is not None and self.run_state.state == RunStatus.FAILED:
            self._show_failure(failure)
        else:
            self.restart_trainer()

    def _palette_callback(self, action: str) -> Callable[[], Any]:
        async def run() -> None:
            await self.run_action(action)

        return run

    @on(GradTable.ViewChanged)
    def _grad_view_changed(self, event: GradTable.ViewChanged) -> None:
        self.notify(event.description, timeout=2)


def _command_subject(command: protocol.Message) -> str:
    """What a command is about, as the user asked for it: the option's name, or the command's."""
    match command:
        case protocol.SetCommand():
            return command.option
        case protocol.TrialCommand():
            return "trial"
        case _:
            return command.type.replace("_", " ")


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


def terminal_hung_up() -> bool:
    """True when this process's terminal has hung up (every terminal call fails with EIO)."""
    for stream in (sys.__stdin__, sys.__stdout__):
        try:
            termios.tcgetattr(stream.fileno())
        except termios.error as error:
            if error.args and error.args[0] == errno.EIO:
                return True
        except (AttributeError, OSError, ValueError):  # no such stream, or not a file
            continue
    return False


def make_app(
    link: LinkLike | LinkFactory,
    *,
    workload: str | None = None,
    poll_interval: float = 0.05,
    log_poll_interval: float = 0.5,
    grad_refresh_interval: float = 0.5,
) -> TorchlabApp:
    """The app as users get it: the CLI passes a factory of the real link, the tests a fake one.

    ``link`` is a link instance or a zero-argument factory; the app calls the factory and then
    ``start()`` from the main thread when it mounts, so the window shows before the trainer exists.
    ``workload`` is shown in the header until the trainer's welcome names it. The intervals are
    the drain timer, the trainer.log tail, and the least time between gradient-table updates; tests
    set them so that nothing happens unless they call ``poll_now``.
    """
    return TorchlabApp(
        link,
        workload=workload,
        poll_interval=poll_interval,
        log_poll_interval=log_poll_interval,
        grad_refresh_interval=grad_refresh_interval,
    )
