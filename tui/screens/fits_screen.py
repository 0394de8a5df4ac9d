"""What fits: the memory a step would take under the settings in force and under each change worth weighing,
predicted on fake tensors by the run's forecaster (core/engine/forecast/forecaster.py), with whether each fits what
a rank has. The table ``torchlab-tui plan`` prints before a launch, for the run as it is now.

Opening it asks the trainer for the predictions where the app has not yet; rows come as each is predicted. Each
row is named by the change that makes it from the settings in force now (``amp=bf16``), so a row predicted before
a change reads right after it. What the figures leave out is said under the table.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Label, Static

from torchlab.core.options import MEMORY_SHAPING, format_option_value
from torchlab.core.units import format_bytes
from torchlab.core.wire.events import MemoryPredicted, shapes_in_words
from torchlab.core.wire.payloads import FIRST_BATCH, NOT_MODELLED
from torchlab.tui.screens.view_screen import ViewScreen, closing_key
from torchlab.tui.state import RunState

#: A verdict's colour.
_VERDICT_STYLE = {"yes": "green", "tight": "yellow", "no": "bold red"}


def change_from(settings: dict[str, Any], in_force: dict[str, Any]) -> str:
    """``settings`` as the change that makes them from ``in_force``: ``amp=bf16, checkpointing=on``, or ``in force``."""
    words = [f"{name}={format_option_value(name, settings.get(name)) if name in MEMORY_SHAPING else settings.get(name)}"
             for name in (*MEMORY_SHAPING, "batch_size") if settings.get(name) != in_force.get(name)]
    return ", ".join(words) or "in force"


def fits_rows(state: RunState) -> list[tuple[str, MemoryPredicted]]:
    """The predictions, the settings in force first, then by peak (the least memory last is what a user scans for)."""
    in_force = state.settings_in_force()
    rows = [(change_from(event.settings, in_force), event) for event in state.predictions.values()]
    return sorted(rows, key=lambda row: (row[0] != "in force", -(row[1].corrected_peak_bytes or 0)))


class FitsScreen(ViewScreen):
    """The predictions so far, live."""

    DEFAULT_CSS = """
    FitsScreen #fits-notes { height: auto; padding: 1 0 0 0; color: $text-muted; }
    """

    BINDINGS = [closing_key("F")]

    def compose(self) -> ComposeResult:
        with Vertical(id="view"):
            yield Label("", id="fits-status", classes="view-status")
            yield DataTable(id="fits-table", cursor_type="row", zebra_stripes=True)
            yield Static("", id="fits-notes")
            yield Label("esc back · predicted on fake tensors, beside the trainer, at idle priority", classes="view-keys")

    def on_mount(self) -> None:
        self.query_one("#view").border_title = "what fits"
        table = self.query_one(DataTable)
        table.add_column("change", key="change")
        for key, title in (("peak", "peak/rank"), ("fits", "fits"), ("weights", "weights"), ("activations", "activ."),
                           ("other", "other")):
            table.add_column(Text(title, justify="right"), key=key)
        self.show_state(self.state)

    def show_state(self, state: RunState) -> None:
        version = (state.forecast_version, state.options_version)
        if version == self._seen_version:
            return
        self._seen_version = version
        rows = fits_rows(state)
        table = self.query_one(DataTable)
        table.clear()
        status = self.query_one("#fits-status", Label)
        if not rows:
            status.update("Predicting, at idle priority beside training: the workload loads without its weights, then "
                          "each setting takes a second or more (longer while training keeps every core busy)."
                          if state.forecast_requested else "Nothing predicted (a read-only view, or a run that ended).")
        else:
            capacity = rows[0][1].capacity or "the memory of a rank is unknown"
            status.update(f"{len(rows)} settings predicted · fits: yes under 90 % of a rank's memory: {capacity}")
        ratio, cannot = None, []
        for change, event in rows:
            table.add_row(*_cells(change, event))
            ratio = event.ratio if event.ratio is not None else ratio
            if event.prediction is None or event.prediction.refused is not None:
                cannot.append(f"{change}: {event.error if event.prediction is None else event.prediction.refused}")
        notes = [*cannot, NOT_MODELLED, *([_batch_note(state, rows)] if rows else [])]
        if state.options.get("compile"):
            notes.insert(0, "compile is on: predicted as the model runs eagerly, which may save more or less for "
                            "backward than inductor's graphs (-21 % to +12 % on the matrix's models); each setting "
                            "trained is measured, and the peaks after it scaled by this run's ratio")
        if ratio is not None:
            notes.append(f"peaks scaled by this run's measured over predicted, {ratio:.3f}")
        self.query_one("#fits-notes", Static).update("\n".join(notes))


def _batch_note(state: RunState, rows: list[tuple[str, MemoryPredicted]]) -> str:
    """Which batch the predictions ran: the run's longest so far, or (asked before its first step) the dataset's first."""
    longest = state.longest_batch
    if longest is None or any(event.longest_batch_elements != longest.elements for _, event in rows):
        return FIRST_BATCH if longest is None else f"{FIRST_BATCH}; the run's longest so far is being predicted"
    return (f"predicted with the run's longest batch so far ({shapes_in_words(longest.shapes)}, step {longest.step}); "
            f"a longer one takes more")


def _cells(change: str, event: MemoryPredicted) -> tuple[Text, ...]:
    prediction = event.prediction
    if prediction is None or prediction.refused is not None:  # why: under the table
        return (Text(change), Text("—", justify="right"), Text("cannot", justify="right", style="yellow"),
                Text(""), Text(""), Text(""))
    return (Text(change, style="bold" if change == "in force" else ""),
            Text(format_bytes(event.corrected_peak_bytes or 0), justify="right"),
            Text(event.verdict, justify="right", style=_VERDICT_STYLE.get(event.verdict, "")),
            Text(format_bytes(prediction.weights_at_peak), justify="right"),
            Text(format_bytes(prediction.at_peak.get("activations", 0)), justify="right"),
            Text(format_bytes(prediction.other_at_peak), justify="right"))
