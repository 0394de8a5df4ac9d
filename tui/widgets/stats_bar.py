"""The latest figures of the run in one line: loss, LR, throughput, step time, gradient norm."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from torchlab.tui.formatting import format_number
from torchlab.tui.state import RunState


class StatsBar(Static):
    """Current loss (and validation loss), LR, samples/s, step time and total grad norm, most important first."""

    DEFAULT_CSS = """
    StatsBar {
        height: 1;
        padding: 0 1;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    """

    def show(self, state: RunState) -> None:
        record = state.last_record
        text = Text()
        if not record:
            text.append("no metrics yet", style="dim italic")
            self.update(text, layout=False)
            return

        def figure(label: str, value: str, style: str = "bold") -> None:
            if text:
                text.append("  ")
            text.append(f"{label} ", style="dim")
            text.append(value, style=style)

        figure("loss", format_number(state.loss.last))
        figure("lr", format_number(state.lr.last, 3))
        samples = state.samples_per_s.last
        if samples is not None:
            figure("samples/s", f"{samples:,.0f}")
        step_time = state.step_time.last
        if step_time is not None:
            figure("step", f"{step_time * 1000:.1f} ms")
        total = record.get("grad_norm_total")
        if isinstance(total, (int, float)) and not isinstance(total, bool):
            clipped = " clipped" if record.get("clipped") else ""
            figure("grad", f"{format_number(float(total), 3)}{clipped}")
        if state.val_loss.last is not None:
            figure("val", format_number(state.val_loss.last), "bold yellow")
        for name, (train, _) in list(state.workload_metrics.items())[:1]:  # the workload's first metric (accuracy)
            if train.last is not None:
                figure(name, format_number(train.last))
        if state.telemetry is not None:
            figure("cpu", f"{state.telemetry.host.cpu_percent:.0f}%")
        self.update(text, layout=False)
