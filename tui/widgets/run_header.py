"""The top line: which run this is and where it stands, readable at a glance from across the room."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from torchlab.core.wire.trials import trial_progress_text
from torchlab.tui.formatting import format_duration
from torchlab.tui.state import RunState

#: State name -> (symbol, style) for the state badge.
STATE_BADGES = {
    "connecting": ("◌", "italic"),
    "starting": ("◌", "bold yellow"),
    "running": ("●", "bold green"),
    "paused": ("❚❚", "bold yellow"),
    "relaunching": ("↻", "bold yellow"),
    "stopped": ("■", "bold"),
    "finished": ("✔", "bold green"),
    "failed": ("✖", "bold red"),
}


class RunHeader(Static):
    """Workload, device, state, step of total, elapsed time and ETA, on one line."""

    DEFAULT_CSS = """
    RunHeader {
        height: 1;
        background: $panel;
        color: $text;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    """

    def show(self, state: RunState) -> None:
        """Redraw from the run state (called by the app's refresh timer when the header changed)."""
        symbol, style = STATE_BADGES.get(state.state, ("?", "bold magenta"))
        text = Text.assemble((" torchlab ", "bold reverse"), " ")
        text.append(state.workload or "…", style="bold")
        if state.device:
            text.append(f" on {state.device}")
        if state.read_only:
            text.append(" · view only", style="bold cyan")
        text.append("  ")
        trial = state.running_trial()
        if trial is not None:  # training waits for it: the trial is the state (and fits 80 columns with the step)
            text.append(f"{symbol} {trial_progress_text(trial)}", style="bold magenta")
        else:
            text.append(f"{symbol} {state.state}", style=style)
        if state.state == "relaunching" and state.state_detail:  # "2 → 1": the world size it goes to
            text.append(f" {state.state_detail}", style=style)
        total = f"/{state.total_steps}" if state.total_steps else ""
        text.append(f"  step {state.step}{total}")
        if state.total_steps:
            text.append(f" {100 * state.step / state.total_steps:.0f}%", style="dim")
        text.append(f"  elapsed {format_duration(state.elapsed_s)}")
        eta = state.eta_s() if trial is None else None  # a trial's steps do not count towards the run's
        if eta is not None:
            text.append(f"  ETA {format_duration(eta)}")
        self.update(text, layout=False)
