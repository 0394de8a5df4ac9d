"""The top line: which run this is and where it stands, readable at a glance from across the room.

It says what the trainer is doing when that is not a step (a trial's arm, a compile), and its elapsed time
runs on from a local clock between reports: a trial or a compile sends none for minutes."""

from __future__ import annotations

from rich.text import Text

from torchlab.core.analysis.trial_words import trial_progress_text
from torchlab.core.wire.run_status import RunStatus
from torchlab.tui.formatting import format_duration, short_workload
from torchlab.tui.state import RunState
from torchlab.tui.widgets.fitted_line import FittedLine

#: State name -> (symbol, style) for the state badge.
STATE_BADGES = {
    RunStatus.CONNECTING: ("◌", "italic"),
    RunStatus.STARTING: ("◌", "bold yellow"),
    RunStatus.RUNNING: ("●", "bold green"),
    RunStatus.PAUSED: ("❚❚", "bold yellow"),
    RunStatus.RELAUNCHING: ("↻", "bold yellow"),
    RunStatus.STOPPED: ("■", "bold"),
    RunStatus.FINISHED: ("✔", "bold green"),
    RunStatus.FAILED: ("✖", "bold red"),
}


class RunHeader(FittedLine):
    """Workload, device, state, step of total, elapsed time and ETA, on one line; what does not fit is left out
    whole, from the end."""

    DEFAULT_CSS = """
    RunHeader {
        height: 1;
        background: $panel;
        color: $text;
    }
    """

    #: Seconds between redraws of the clock when no report comes.
    TICK_S = 1.0

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._state: RunState | None = None

    def on_mount(self) -> None:
        self.set_interval(self.TICK_S, self._tick)

    def _tick(self) -> None:
        if self._state is not None and self._state.state == RunStatus.RUNNING:
            self.show(self._state)

    def show(self, state: RunState) -> None:
        """Redraw from the run state (called by the app's refresh timer when the header changed, and each
        second while the run runs)."""
        self._state = state
        symbol, style = STATE_BADGES.get(state.state, ("?", "bold magenta"))
        run = Text.assemble((" torchlab ", "bold reverse"), " ", (short_workload(state.workload) or "…", "bold"))
        if state.device:
            run.append(f" on {state.device}")
        if state.read_only:
            run.append(" · view only", style="bold cyan")
        trial = state.running_trial()
        if trial is not None:  # training waits for it: the trial is the state
            badge = Text(f"{symbol} {trial_progress_text(trial)}", style="bold magenta")
        elif state.compiling:
            badge = Text(f"◌ {state.state_detail}", style="bold magenta")
        elif state.hung_at is not None and state.state == RunStatus.RUNNING:  # said by the hang watch: q ends it
            badge = Text(f"⚠ hung at step {state.hung_at}", style="bold red")
        else:
            badge = Text(f"{symbol} {state.state}", style=style)
        if state.state == RunStatus.RELAUNCHING and state.state_detail:  # "2 → 1": the world size it goes to
            badge.append(f" {state.state_detail}", style=style)
        total = f"/{state.total_steps}" if state.total_steps else ""
        step = Text(f"step {state.step}{total}")
        if state.total_steps:
            step.append(f" {100 * state.step / state.total_steps:.0f}%", style="dim")
        eta = state.eta_s() if trial is None else None  # a trial's steps do not count towards the run's
        if eta is not None:
            eta_part = Text(f"ETA {format_duration(eta)}")
        else:  # "…" until enough steps were measured: the first ones (start-up, a compile) would say hours
            eta_part = Text("ETA …") if trial is None and state.eta_pending else Text()
        parts = [run, badge, step, Text(f"elapsed {format_duration(state.elapsed_now())}"), eta_part]
        self.set_parts(parts, importance=(0, 1, 2, 4, 3))  # where only one fits, the ETA
