"""The protocol's commands, from the app to the trainer: each a typed, versioned line of JSON (core/wire/codec.py),
bounded so that no command can echo a huge value into a refusal or the run's journal. A part of the protocol's one
vocabulary: core/wire/protocol.py re-exports every name here (``p.SetCommand``), with the events that answer them.

The trainer takes these objects as they are: from the app's socket (the worker stamps ``source="app"``), from
``--at`` and ``--profile-at``, from a signal handler, and, as these same lines, from rank 0 to the other ranks and
from a supervisor to rank 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from torchlab.core.errors import shown
from torchlab.core.wire.codec import Message, ProtocolError
from torchlab.core.wire.typed_json import JsonScalar

#: A live option's name, a command's source and a value typed for it are short; longer ones are refused
#: before anything echoes them.
MAX_OPTION_CHARS = 64
MAX_SOURCE_CHARS = 64
MAX_VALUE_CHARS = 256
#: No option or count is this large; a larger integer (JSON reads up to 4,300 digits) is refused as a
#: message, before float() of it can overflow or a record repeats it.
MAX_COMMAND_INT = 10**18




@dataclass(frozen=True)
class Hello(Message):
    """The first command on a connection: proves the client is the run's owner (the token). ``view``: a
    read-only viewer, any number of them beside the one app that controls the run."""

    type: ClassVar[str] = "hello"
    version: int
    token: str
    client: str = "torchlab-tui"
    view: bool = False


@dataclass(frozen=True)
class TrainerCommand(Message):
    """Base of what a trainer acts on at a step boundary (Hello and Detach are the connection's, not the trainer's)."""


@dataclass(frozen=True)
class PauseCommand(TrainerCommand):
    type: ClassVar[str] = "pause"


@dataclass(frozen=True)
class ResumeCommand(TrainerCommand):
    type: ClassVar[str] = "resume"


@dataclass(frozen=True)
class StopCommand(TrainerCommand):
    """Stop at the next step boundary, write a final checkpoint, exit; ``reason`` goes to the run's outcome."""

    type: ClassVar[str] = "stop"
    reason: str = "requested"

    def validate(self) -> None:
        _check_length("stop.reason", self.reason, MAX_VALUE_CHARS)


@dataclass(frozen=True)
class SetCommand(TrainerCommand):
    """Change a live option at the next step boundary; answered by OptionApplied or OptionRefused."""

    type: ClassVar[str] = "set"
    option: str
    value: JsonScalar
    source: str = "app"

    def validate(self) -> None:
        _check_option_command(self)


@dataclass(frozen=True)
class TrialCommand(TrainerCommand):
    """Try ``option`` = ``value`` for ``steps`` steps against as many as it is, from the same state on the same
    batches, then go on as if nothing was tried; answered by TrialResult (which says why, if it could not run)."""

    type: ClassVar[str] = "trial"
    option: str
    value: JsonScalar
    steps: int
    source: str = "app"

    def validate(self) -> None:
        _check_option_command(self)


def _check_option_command(command: SetCommand | TrialCommand) -> None:
    """Bounded, so that no command can echo a huge value into the refusal and the run's journal."""
    _check_length(f"{command.type}.option", command.option, MAX_OPTION_CHARS)
    _check_length(f"{command.type}.source", command.source, MAX_SOURCE_CHARS)
    if isinstance(command.value, str):
        _check_length(f"{command.type}.value", command.value, MAX_VALUE_CHARS)
    _check_magnitude(f"{command.type}.value", command.value)


#: Steps a profiler snapshot records unless told: ``--profile-steps``, the app's ``p`` and a profile message's default.
DEFAULT_PROFILE_STEPS = 5


@dataclass(frozen=True)
class ProfileCommand(TrainerCommand):
    """Profile the next ``steps`` optimizer steps (after one warm-up step)."""

    type: ClassVar[str] = "profile"
    steps: int = DEFAULT_PROFILE_STEPS
    source: str = "app"

    def validate(self) -> None:
        _check_magnitude("profile.steps", self.steps)
        _check_length("profile.source", self.source, MAX_SOURCE_CHARS)


def _check_length(field_name: str, text: str, limit: int) -> None:
    if len(text) > limit:
        raise ProtocolError(f"{field_name}: longer than {limit} characters")


def _check_magnitude(field_name: str, value: Any) -> None:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_COMMAND_INT:
        raise ProtocolError(f"{field_name}: {shown(value)} is out of range (at most 1e18 in size)")


@dataclass(frozen=True)
class SaveCheckpointCommand(TrainerCommand):
    type: ClassVar[str] = "save_checkpoint"


@dataclass(frozen=True)
class ForecastCommand(TrainerCommand):
    """Predict the memory of a step under the settings in force and under each change worth weighing (each key's
    next value, ``torchlab-tui plan``'s candidates), off the training path: answered by one ``memory_predicted`` a
    setting, as each is predicted (core/engine/forecast/forecaster.py). Its supervisor takes it when it comes, not
    at a step boundary; from then on each change of the settings is predicted around too."""

    type: ClassVar[str] = "forecast"


@dataclass(frozen=True)
class DetachCommand(Message):
    """The app leaves on purpose; the trainer keeps training. Answered by Detached."""

    type: ClassVar[str] = "detach"
