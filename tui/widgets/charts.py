"""The three charts of the main screen: loss and val loss, the learning rate (each parameter group's, where the
workload's optimizer has several), and samples/s or one of the workload's own metrics (``f`` cycles them).

A chart of several lines names each in its title with the line's marker and colour (``● loss · ▲ val loss``):
the marker tells them apart where colour does not show (NO_COLOR)."""

from __future__ import annotations

from textual.containers import Vertical
from textual.markup import escape

from torchlab.core.wire.metric_names import validation_label_of
from torchlab.tui.state import RunState
from torchlab.tui.widgets.line_chart import MARK, ChartLine, LineChart, marker

#: The markup colour of a chart's line of each style (LineChart's ``line-chart--series-N``), for its title.
_LINE_COLOURS = ("", "$warning", "$success")
#: What the third chart shows when it does not show one of the workload's metrics.
SPEED = "samples/s"


class Charts(Vertical):
    """Owns which lines each chart draws; the app redraws them as the state grows (``LineChart.data_changed``)."""

    def __init__(self, state: RunState, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.state = state
        #: what the third chart shows: ``SPEED`` or a metric's name; None until the user or a metric chose
        self.third: str | None = None
        self._seen_version = -1
        self._spikes_titled = False
        self._val_named: tuple[bool, bool] = (False, False)  # the loss chart's, the metric chart's: a val line named

    def compose(self):
        state = self.state
        yield LineChart(ChartLine(state.loss, "loss"), ChartLine(state.val_loss, "val loss"), marks=state.spikes,
                        id="loss-chart")
        yield LineChart(ChartLine(state.lr, "lr", style=2), id="lr-chart")
        yield LineChart(ChartLine(state.samples_per_s, SPEED), id="speed-chart")

    def on_mount(self) -> None:
        self._title_loss_chart()
        self.query_one("#lr-chart").border_title = "learning rate"
        self._show_third()

    def _title_loss_chart(self) -> None:
        """Its lines (the validation loss's once there is one: a run without a validation set has none), and once a
        step spiked, what its marks are."""
        spikes = f" · [$error]{MARK} spike[/]" if self.state.spikes else ""
        named = ["loss", "val loss"] if len(self.state.val_loss) else ["loss"]
        self.query_one("#loss-chart").border_title = _titled(named, lines=2) + spikes

    def _val_lines_named(self) -> tuple[bool, bool]:
        pair = self.state.workload_metrics.get(self.third) if self.third is not None else None
        return bool(len(self.state.val_loss)), bool(pair is not None and len(pair[1]))

    def show(self) -> None:
        """Follow a group or a metric the trainer reported for the first time, the first spike, and the first
        validation figure."""
        named = self._val_lines_named()
        if (self.state.spikes and self._spikes_titled != bool(self.state.spikes)) or named[0] != self._val_named[0]:
            self._spikes_titled = bool(self.state.spikes)
            self._title_loss_chart()
        if named[1] != self._val_named[1]:
            self._show_third()
        self._val_named = named
        if self.state.named_series_version == self._seen_version:
            return
        self._seen_version = self.state.named_series_version
        groups = list(self.state.group_lrs.items())
        if groups:
            shown = groups[: len(_LINE_COLOURS)]
            chart = self.query_one("#lr-chart", LineChart)
            chart.lines = [ChartLine(series, name, style=index) for index, (name, series) in enumerate(shown)]
            more = f" +{len(groups) - len(shown)}" if len(groups) > len(shown) else ""
            chart.border_title = "lr " + _titled([name for name, _ in shown]) + more
            chart.data_changed()
        if self.third is None and self.state.workload_metrics:  # the workload said what it cares about: show it
            self.third = next(iter(self.state.workload_metrics))
        self._show_third()

    def next_chart(self) -> str:
        """Show the next of samples/s and the workload's metrics on the third chart; returns its name."""
        choices = [SPEED, *self.state.workload_metrics]
        current = self.third if self.third in choices else SPEED
        self.third = choices[(choices.index(current) + 1) % len(choices)]
        self._show_third()
        return self.third

    def _show_third(self) -> None:
        chart = self.query_one("#speed-chart", LineChart)
        pair = self.state.workload_metrics.get(self.third) if self.third is not None else None
        self.set_class(pair is not None, "-metric")  # on a short screen, a metric takes the LR chart's place
        if pair is None:
            chart.lines = [ChartLine(self.state.samples_per_s, SPEED)]
            chart.border_title = SPEED
        else:
            name = self.third
            chart.lines = [ChartLine(pair[0], name), ChartLine(pair[1], validation_label_of(name))]
            chart.border_title = _titled([name, validation_label_of(name)] if len(pair[1]) else [name], lines=2)
        chart.data_changed()


def _titled(names: list[str], lines: int | None = None) -> str:
    """A title naming the lines of a chart in their styles 0, 1, 2 (at most three): each name after its line's
    marker, in its line's colour. ``lines``: how many the chart draws, where it names fewer (a validation line with
    no point yet). A line alone has no marker (LineChart draws none), so its name stands alone."""
    if (lines or len(names)) == 1:
        return escape(names[0])
    return " · ".join(_coloured(f"{marker(style)} {escape(name)}", style) for style, name in enumerate(names))


def _coloured(markup: str, style: int) -> str:
    colour = _LINE_COLOURS[style]
    return f"[{colour}]{markup}[/]" if colour else markup
