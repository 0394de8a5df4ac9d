"""What the run's forecaster predicted (``memory_predicted``): a step's memory under the settings in force and under
each change worth weighing. The "what fits" view lists them; a key or a prompt that changes a setting says its
prediction with the request (``checkpointing = on requested: peak 60.7 → 26.9 MiB predicted``), and a change
predicted not to fit is asked to be confirmed before it is sent (``forecast_check``).

A part of ``RunState`` (state.py), which dispatches each message; this part declares the fields it fills
(``_init_forecasts``). Predictions are keyed by the settings they are for, so one made before a change still
answers for its settings after it: each is asked once a run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torchlab.core.options import MEMORY_SHAPING, format_option_value
from torchlab.core.units import format_bytes
from torchlab.core.wire.events import LongestBatch, MemoryPredicted, describe
from torchlab.tui.log_levels import EntryLevel

#: What a prediction is for, besides the options that shape memory: the batch of all ranks.
_SETTING_KEYS = (*MEMORY_SHAPING, "batch_size")


@dataclass(frozen=True)
class ForecastCheck:
    """What the forecast says of one change before it is sent: ``words`` for its request's line ("" where nothing
    is predicted yet), and ``over``: the words of a refusal where it is predicted not to fit (None where it fits or
    nothing says)."""

    words: str
    over: str | None = None


class Forecasts:
    """How ``RunState`` keeps the forecaster's predictions and reads them for a change."""

    def _init_forecasts(self) -> None:
        """The fields of this part: nothing is predicted until the app asks (``forecast_requested``)."""
        #: the app asked the trainer for predictions (the "what fits" view, or on its own once the run trains)
        self.forecast_requested = False
        #: settings (``_key``) -> the newest prediction for them
        self.predictions: dict[tuple, MemoryPredicted] = {}
        self.forecast_version = 0
        #: why the forecaster could not predict, said once in the log (the same reason comes for every setting)
        self._forecast_errors_said: set[str] = set()
        #: the run's longest batch so far, which the predictions are made with (None: none announced yet)
        self.longest_batch: LongestBatch | None = None

    def _on_forecast(self, event: MemoryPredicted | LongestBatch) -> None:
        if isinstance(event, LongestBatch):
            self._on_longest_batch(event)
        else:
            self._on_memory_predicted(event)

    def _on_memory_predicted(self, event: MemoryPredicted) -> None:
        self.predictions[_key(event.settings)] = event
        self.forecast_version += 1
        if event.prediction is None and event.error and event.error not in self._forecast_errors_said:
            self._forecast_errors_said.add(event.error)
            self.log(EntryLevel.WARNING, f"what fits: {event.change} not predicted: {event.error}", event.step)

    def _on_longest_batch(self, event: LongestBatch) -> None:
        """A longer batch than any before: said in the log (not the run's first: that is no news); what fits says it
        predicts with it."""
        self.longest_batch = event
        self.forecast_version += 1
        sentence = describe(event)
        if sentence is not None:
            self.log(EntryLevel.INFO, sentence.text, event.step)

    # ------------------------------------------------------------------ reading them
    def settings_in_force(self, **changes: Any) -> dict[str, Any]:
        """The settings that shape memory as they will be once the requests on their way apply, with ``changes``."""
        settings = {name: self.pending.get(name, self.options.get(name)) for name in MEMORY_SHAPING}
        settings["batch_size"] = self.batch_size
        return {**settings, **changes}

    def predicted(self, **changes: Any) -> MemoryPredicted | None:
        """The prediction for the settings in force with ``changes`` (None: not predicted yet)."""
        return self.predictions.get(_key(self.settings_in_force(**changes)))

    def forecast_check(self, option: str, value: Any) -> ForecastCheck:
        """What the forecast says of ``option`` = ``value`` before it is sent (``ForecastCheck``)."""
        if option not in MEMORY_SHAPING:
            return ForecastCheck("")
        now, then = self.predicted(), self.predicted(**{option: value})
        if then is None or then.corrected_peak_bytes is None:
            return ForecastCheck("")
        peak = then.corrected_peak_bytes
        before = f"{format_bytes(now.corrected_peak_bytes)} → " if now is not None and now.corrected_peak_bytes is not None else ""
        words = f"peak {before}{format_bytes(peak)} predicted{_per_rank(then)}"
        if then.verdict != "no":
            return ForecastCheck(words)
        over = (f"{option} = {format_option_value(option, value)} is predicted not to fit: a peak of {format_bytes(peak)}"
                f"{_per_rank(then)}, over the {format_bytes(then.capacity_bytes)} a rank has ({then.capacity})")
        return ForecastCheck(words, over)


def _key(settings: dict[str, Any]) -> tuple:
    return tuple(settings.get(name) for name in _SETTING_KEYS)


def _per_rank(event: MemoryPredicted) -> str:
    return " per rank" if (event.settings.get("world_size") or 1) > 1 else ""
