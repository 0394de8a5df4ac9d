"""Where the time goes (``B``): the verdict, each measured row's phases over time as a bar, and where a step's FLOPs
are, by module and by op (core/engine/measure/step_phases.py, flops.py, module_flops.py; docs/where-time-goes.md).

A bar is a row of the probe's cadence (the steps since the row before), scaled to the slowest row shown, so a
change that made the steps faster is a shorter bar, and its colours say which phase shrank; the probes' own time is
left out, as from the shares. The FLOPs are those of the newest kind of step counted (its first batch's shapes and
the settings that change its work); by op, beside each, the FLOP/s it reached in the newest profiler snapshot where
that snapshot ran after the count, under the settings counted (``p`` takes one): an op's own time there
(``self_device_us`` on CUDA, else ``self_cpu_us``) over its steps.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Label, Static

from torchlab.core.wire.events import FlopsCounted, shapes_in_words
from torchlab.core.wire.metrics_row import MetricsRow
from torchlab.core.options import format_option_value
from torchlab.core.units import format_count
from torchlab.tui.formatting import format_number
from torchlab.tui.profiles import ProfileSnapshot
from torchlab.tui.screens.view_screen import ViewScreen, closing_key
from torchlab.tui.state import RunState
from torchlab.tui.widgets.stats_bar import PHASE_STYLES

#: The rows of phases drawn, newest last: at most, and at least (a short terminal's); the rest of the height is the
#: modules'.
MOST_ROWS, LEAST_ROWS = 12, 3
#: The lines the view takes besides its bars and its table's rows: frame, status, legend, titles, keys.
_FIXED_LINES = 12
#: The bars' widest, in cells.
BAR_WIDTH = 40
#: Modules and ops listed, largest first.
TOP_MODULES = 30
TOP_OPS = 5


def phase_rows(rows: list[MetricsRow], width: int = BAR_WIDTH) -> Text:
    """Each row's steps as a bar coloured by phase, scaled to the slowest shown, with its step, its time a step and
    its MFU; then the colours named."""
    text = Text()
    seconds = [sum(row.phases.seconds().values()) - row.phases.probes_s for row in rows]  # type: ignore[union-attr]
    slowest = max(seconds, default=0.0) or 1.0
    for row, step_s in zip(rows, seconds):
        phases = row.phases.seconds()  # type: ignore[union-attr]
        text.append(f"{row.step:>7} {format_number(step_s * 1000):>7} ms ")
        drawn, reached = 0, 0.0  # each phase ends at its cumulative share rounded: the bar is as long as its step
        for phase, style in PHASE_STYLES.items():
            reached += phases[phase]
            cells = round(width * reached / slowest) - drawn
            text.append("█" * cells, style=style)
            drawn += cells
        mfu = row.phases.mfu  # type: ignore[union-attr]
        text.append(" " * max(0, width - drawn) + (f" MFU {mfu * 100:.2g} %" if mfu is not None else "") + "\n")
    for phase, style in PHASE_STYLES.items():
        text.append(f"█ {phase}  ", style=style)
    return text


def profiled_flops(counted: FlopsCounted, profile: ProfileSnapshot | None, options: dict) -> dict[str, float]:
    """Op -> the FLOP/s it reached in ``profile``, where it ran after the count under the settings counted (else
    nothing): its FLOPs a step times the steps profiled, over its own time there."""
    if (profile is None or profile.error is not None or profile.first_step <= counted.step
            or any(options.get(name) != value for name, value in counted.settings.items())):
        return {}
    steps = profile.last_step - profile.first_step + 1
    reached = {}
    for row in profile.rows:
        own_us = row.get("self_device_us") or row.get("self_cpu_us") or 0.0
        flops = next((entry.flops for entry in counted.by_op if entry.op == row.get("name")), 0)
        if flops and own_us > 0:
            reached[row["name"]] = flops * steps / (own_us * 1e-6)
    return reached


class TimeScreen(ViewScreen):
    """Where the time goes, live."""

    DEFAULT_CSS = """
    TimeScreen #time-phases { height: auto; padding: 1 0 0 0; }
    TimeScreen #time-flops-title { padding: 1 0 0 0; text-style: bold; width: 1fr; height: auto; }
    TimeScreen #time-ops { height: auto; }
    """

    BINDINGS = [closing_key("B")]

    def compose(self) -> ComposeResult:
        with Vertical(id="view"):
            yield Label("", id="time-status", classes="view-status")
            yield Static(id="time-phases")
            yield Label("", id="time-flops-title")
            yield Static(id="time-ops")
            yield DataTable(id="time-modules", cursor_type="row", zebra_stripes=True)
            yield Label("esc back · a bar is the steps since the row before, on the probe's cadence; "
                        "T trials the verdict's change · p profiles (FLOP/s by op)", classes="view-keys")

    def on_mount(self) -> None:
        self.query_one("#view").border_title = "where the time goes"
        table = self.query_one(DataTable)
        table.add_column("module", key="module")
        for key in ("forward", "backward", "recompute", "share"):
            table.add_column(Text(key, justify="right"), key=key)
        self.show_state(self.state)

    def show_state(self, state: RunState) -> None:
        version = (state.time_version, state.profiles_version)
        if version == self._seen_version:
            return
        self._seen_version = version  # type: ignore[assignment]
        rows = list(state.phase_rows)[-self._rows_shown():]
        verdict = state.bottleneck.current
        status = self.query_one("#time-status", Label)
        if not rows:
            status.update("No row has carried phases yet: they come on the probe's cadence (--probe-every), once a step "
                          "was timed (not the first, whose FLOPs are counted).")
        else:
            said = verdict.text if verdict is not None else "the verdict waits for more steps under the settings in force"
            status.update(f"step {rows[-1].step} · {said}")
        self.query_one("#time-phases", Static).update(phase_rows(rows) if rows else "")
        self._show_flops(state)

    def _rows_shown(self) -> int:
        """Half the height the view has for rows goes to the bars (80x24: 6)."""
        return max(LEAST_ROWS, min(MOST_ROWS, (self.app.size.height - _FIXED_LINES) // 2))

    def _show_flops(self, state: RunState) -> None:
        counted, title = state.flops_counted, self.query_one("#time-flops-title", Label)
        ops, table = self.query_one("#time-ops", Static), self.query_one(DataTable)
        table.clear()
        if counted is None:
            title.update("FLOPs: none counted yet (the first training step counts them)")
            ops.update("")
            return
        settings = ", ".join(f"{name} {format_option_value(name, value)}" for name, value in counted.settings.items())
        again = f" (+{format_count(counted.recomputed)} recomputed)" if counted.recomputed else ""
        title.update(f"FLOPs a step: {format_count(counted.flops)}{again} in {counted.ops} ops (counted at step "
                     f"{counted.step}: batch {shapes_in_words(counted.shapes)}; {settings})")
        ops.update(_ops_line(counted, profiled_flops(counted, state.profiles[-1] if state.profiles else None, state.options)))
        for entry in counted.by_module[:TOP_MODULES]:
            share = entry.total / (counted.flops + counted.recomputed) if counted.flops else 0.0
            table.add_row(entry.module, *(Text(format_count(value), justify="right")
                                          for value in (entry.forward, entry.backward, entry.recompute)),
                          Text(f"{share * 100:.0f} %", justify="right"))


def _ops_line(counted: FlopsCounted, reached: dict[str, float]) -> Text:
    """The ops holding the most FLOPs, each with its share, and the FLOP/s a profile saw it reach where one did."""
    text = Text("by op: ", style="bold")
    for entry in counted.by_op[:TOP_OPS]:
        text.append(f"{entry.op} {entry.flops / (counted.flops + counted.recomputed) * 100:.0f} %" if counted.flops else entry.op)
        if entry.op in reached:
            text.append(f" ({format_count(reached[entry.op])}FLOP/s)", style="dim")
        text.append("  ")
    return text
