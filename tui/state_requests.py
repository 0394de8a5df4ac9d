"""The app's requests to the trainer: what was asked and not yet answered (so a key that cycles goes on from it), how
a request is said before the trainer has welcomed the app, and which values a key passes by.

A part of ``RunState`` (state.py), which dispatches each message; the trainer's answers (``OptionApplied``,
``OptionRefused``) reach this part through ``_answered``, and a run that ends or a new trainer's welcome through
``_forget_requests``.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from torchlab.core.options import AMP, OPTIONS_BY_NAME, PARALLEL, format_option_value
from torchlab.tui.log_levels import EntryLevel


class AppRequests:
    """How ``RunState`` keeps the app's requests until the trainer answers them."""

    def _init_requests(self) -> None:
        """The fields of this part: a new state has asked nothing and knows no refusal."""
        #: the trainer this app talks to has welcomed it: False while the link connects and while a restarted trainer
        #: starts, when requests wait (the link and the trainer keep them, in order) for its first step boundary
        self.welcomed = False
        #: the app attached to a trainer that trains already (set by the app from its link): a request made before
        #: its welcome takes effect at its next step boundary, not at a first one
        self.attaching = False
        #: option -> value the app asked for and the trainer has not answered yet (the newest request of
        #: those still unanswered: the trainer answers an option's commands in the order they were sent)
        self.pending: dict[str, Any] = {}
        #: option -> the app's requests not answered yet, oldest first
        self._unanswered: dict[str, deque[Any]] = {}
        #: (option, formatted value) pairs the trainer refused on this run, e.g. ("amp", "fp16") on CPU
        self.refused: set[tuple[str, str]] = set()

    def skips(self, option: str, value: Any) -> bool:
        """A key that cycles ``option`` passes ``value`` by: the trainer refused it on this run, or would
        (``would_refuse``: fp16 on a CPU). The one rule of the main screen's keys and the error screen's."""
        return self.was_refused(option, value) or self.would_refuse(option, value) is not None

    def note_request(self, option: str, value: Any, forecast: str = "") -> None:
        """The app sent a SetCommand: remember it until the answer comes, and log that it is on its way (with what
        the forecast predicts of it, ``forecast``, where it says)."""
        self._unanswered.setdefault(option, deque()).append(value)
        self.pending[option] = value
        self.options_version += 1
        if self.queued is not None:
            self.log(EntryLevel.INFO, f"{option} = {format_option_value(option, value)}: {self.queued}{_said(forecast)}")
            return
        when = OPTIONS_BY_NAME[option].takes_effect
        if option == AMP.name and self.world_size > 1 and self.options.get(PARALLEL.name) == "fsdp":
            when = PARALLEL.takes_effect  # FSDP2's mixed precision is fixed while the ranks live
        self.log(EntryLevel.INFO, f"requested {option} = {format_option_value(option, value)} ({when}){_said(forecast)}")

    @property
    def queued(self) -> str | None:
        """How a request made before the trainer's welcome is said ("queued, applied at the first step boundary"),
        None once welcomed: the trainer takes it before its first step, in the order typed."""
        if self.welcomed:
            return None
        return "queued, applied at the next step boundary once attached" if self.attaching else \
            "queued, applied at the first step boundary"

    def _answered(self, option: str, source: str) -> bool:
        """The trainer answered (applied or refused) the oldest unanswered request of the app for ``option``:
        what stays pending is the newest request after it, or nothing. Answers to others (``--at``) are not ours.
        True when it was this app's request."""
        waiting = self._unanswered.get(option)
        if source != "app" or not waiting:
            return False
        waiting.popleft()
        if waiting:
            self.pending[option] = waiting[-1]
        else:
            del self._unanswered[option]
            self.pending.pop(option, None)
        self.options_version += 1
        return True

    def _forget_requests(self) -> None:
        """No trainer will answer what was asked of the one before (the run ended, or a new one welcomed us)."""
        if self.pending or self._unanswered:
            self.pending.clear()
            self._unanswered.clear()
            self.options_version += 1

    def note_profile_request(self) -> None:
        """The app asked for a profiler snapshot: the list says one is on its way until it arrives."""
        self.profile_pending = True
        self.profiles_version += 1


def _said(forecast: str) -> str:
    return f": {forecast}" if forecast else ""
