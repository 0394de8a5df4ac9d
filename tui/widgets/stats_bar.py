"""The latest figures of the run in one line: loss, LR, throughput, step time and where it goes, gradient norm."""

from __future__ import annotations

from rich.text import Text

from torchlab.core.analysis.bottleneck import Verdict
from torchlab.tui.formatting import format_number
from torchlab.tui.state import RunState
from torchlab.tui.widgets.fitted_line import FittedLine


class StatsBar(FittedLine):
    """Current loss (and validation loss), LR, samples/s, step time and total grad norm, most important first;
    what does not fit is left out whole, from the end."""

    DEFAULT_CSS = """
    StatsBar {
        height: 1;
        padding: 0 1;
    }
    """

    def show(self, state: RunState) -> None:
        row = state.last_row
        if row is None:
            self.set_parts([Text("no metrics yet", style="dim italic")])
            return
        parts: list[Text] = []

        def figure(label: str, value: str, style: str = "bold") -> None:
            parts.append(Text.assemble((f"{label} ", "dim"), (value, style)))

        figure("loss", format_number(state.loss.last))
        figure("lr", format_number(state.lr.last, 3))
        samples = state.samples_per_s.last
        if samples is not None:
            figure("samples/s", f"{samples:,.0f}")
        step_time = state.step_time.last
        if step_time is not None:
            figure("step", f"{step_time * 1000:.1f} ms")
        bottleneck = state.bottleneck.current
        if bottleneck is not None:
            parts.append(phase_bar(bottleneck))
            if bottleneck.mfu is not None:
                figure("MFU", f"{bottleneck.mfu * 100:.2g}%")
        if row.grad_norm_total is not None:
            clipped = " clipped" if row.clipped else ""
            figure("grad", f"{format_number(row.grad_norm_total, 3)}{clipped}")
        if state.val_loss.last is not None:
            figure("val", format_number(state.val_loss.last), "bold yellow")
        for name, (train, _) in list(state.workload_metrics.items())[:1]:  # the workload's first metric (accuracy)
            if train.last is not None:
                figure(name, format_number(train.last))
        if state.telemetry is not None:
            figure("cpu", f"{state.telemetry.host.cpu_percent:.0f}%")
        self.set_parts(parts)


#: Each phase's colour in the bar (core/wire/payloads.py ``PHASES``, the probes' left out).
PHASE_STYLES = {"data": "red", "copy": "magenta", "forward": "blue", "backward": "cyan", "optimizer": "green",
                "communication": "yellow", "other": "bright_black"}
#: The bar's cells: a phase under half of one's share draws none.
BAR_CELLS = 6


def phase_bar(bottleneck: Verdict) -> Text:
    """Where the last measured steps' time went, as a bar of ``BAR_CELLS`` coloured by phase (data red, forward
    blue, backward cyan, optimizer green...), then the bound where one phase holds it (``input-bound 41 %``), or
    ``launch-bound``, else the largest phase: the event log says the verdict in words, and the help (``?``) names the colours."""
    shares = bottleneck.shares
    bar = Text()
    for phase, style in PHASE_STYLES.items():
        bar.append("█" * round(shares[phase] * BAR_CELLS), style=style)
    if bottleneck.kind == "launch-bound":  # its figures are the ops' (the log says them), not a phase's share
        bar.append(" launch-bound", style="bold yellow")
        return bar
    name = bottleneck.phase if bottleneck.kind == "compute" else bottleneck.kind
    bar.append(f" {name} {shares[bottleneck.phase] * 100:.0f}%", style=f"bold {PHASE_STYLES[bottleneck.phase]}")
    return bar

