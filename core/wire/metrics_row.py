"""The metrics row: what one report step says, as one typed record that the trainer builds once
(core/engine/measure/step_report.py ``metrics_row``), the run directory writes to ``metrics.jsonl``, the app is sent (as
columns: the protocol's ``Metrics``) and ``compare``, exports and a resumed app read back. Standard library only:
the app and the trainer share it.

Its schema is declared once, as the annotations of ``MetricsRow``. On disk and on the wire it is the JSON object
``json_object`` makes: the fields in their order, the live options flat in the place of ``options`` (``amp``,
``clip``... as keys of the row, as every line has had them), and a field with a default only where it holds
something else (``lrs`` where the optimizer has several groups, ``val_loss`` on evaluation steps, ``compiling``
where torch.compile compiled: absent, not null, elsewhere). NaN and Inf are written as null (core/wire/strict_json.py).

``from_json`` reads a row back from a line that torchlab wrote, today or in an older version, or that someone
else wrote (a run directory may have been prepared by another user): leniently where the line is old, strictly
where it is wrong. Each value is read as its annotation says with core/wire/typed_json.py (a reason names the
path of what is wrong: ``metrics row.memory.by_module[0].bytes: expected int, got str``), so that a reader's
figures are of their types. Beside that:

- a field whose type admits null may be missing (``data_wait_s`` before the data wait was measured): None;
- a live option a line lacks (one added since it was written: ``workers``, ``steps``...) reads as its default;
- a number written as null, where null does not mean "none", was not finite when written (NaN and Inf are written
  as null): ``loss`` and ``val_loss`` read so as NaN, which keeps "this step was evaluated" in ``val_loss is not
  None``;
- a key the row does not have is not read (a field of a later version; a note someone added).
A line of another shape is an ``UnreadableValue`` (a ValueError) saying why, which its reader skips, as it skips
a torn line.
"""

from __future__ import annotations

import math
import typing
from operator import attrgetter
from dataclasses import MISSING, asdict, dataclass, fields, is_dataclass
from typing import Any

from torchlab.core.errors import shown
from torchlab.core.options import OPTION_NAMES, LiveOptions
from torchlab.core.wire.payloads import MemoryBreakdown, RankFigures, StepPhases
from torchlab.core.wire.strict_json import MAX_INT
from torchlab.core.wire.typed_json import JsonScalar, UnreadableValue, accepted_types, read_value

_NULL = type(None)


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricsRow:
    """One report step's figures: its number, when (``time``, seconds since the epoch; ``elapsed_s``, the run's
    training time), the loss, the LR it used, its speed, its gradients' total norm before clipping and whether it
    clipped (None on steps that did not measure or clip), each module's gradient norm (None on steps the probe
    skipped), whether the precision skipped the optimizer step (fp16 overflow), its wait for batches, and the live
    options in force. Then what only some steps have (each None, or False, elsewhere): each parameter group's LR,
    the workload's own metrics, whether torch.compile compiled during it or it ran uncompiled (the impact table
    leaves both steps' times out), each module's activation statistics (mean, std, max |x|), the memory by kind,
    each rank's figures, the validation loss and metrics (NaN where evaluation gave a loss that is not finite), and
    what the spike guard did with a step that spiked (``skipped``, ``rolled_back``: its update held back, which
    ``skipped``, the precision's, does not say; ``let_through``, ``new_level``: applied)."""

    step: int
    time: float
    elapsed_s: float
    epoch: int
    loss: float
    lr: float
    samples_per_s: float
    step_time_s: float
    grad_norm_total: float | None
    clipped: bool | None
    grad_norms: dict[str, float | None] | None  # null: a norm that was not finite
    skipped: bool
    data_wait_s: float | None  # None in lines written before it was measured
    options: LiveOptions  # flat in the JSON: each option's name is a key of the row
    lrs: dict[str, float | None] | None = None
    metrics: dict[str, float | None] | None = None
    compiling: bool = False
    eager: bool = False
    act_stats: dict[str, list[float | None]] | None = None
    memory: MemoryBreakdown | None = None
    ranks: list[RankFigures] | None = None
    val_loss: float | None = None
    val_metrics: dict[str, float | None] | None = None
    #: where the step's loss or grad norm spiked: what the spike guard did (core/engine/guards/spike_guard.py)
    spike: str | None = None
    #: on steps the probe measured: each module's ‖Δθ‖/‖θ‖ and ‖θ‖, and Adam's [‖m‖, ‖√v‖] (core/engine/measure/update_probe.py)
    update_ratios: dict[str, float | None] | None = None
    weight_norms: dict[str, float | None] | None = None
    adam: dict[str, list[float | None]] | None = None
    #: on steps the probe measured, where the host's clock times the work: where the step's time went
    #: (core/engine/measure/step_phases.py)
    phases: StepPhases | None = None

    def json_object(self) -> dict[str, Any]:
        """The row as its line of ``metrics.jsonl`` holds it (key for key, in order; strict_json writes it). Read
        with one ``attrgetter`` a part, in C: the trainer makes this object on every report step."""
        row = dict(zip(_BEFORE_OPTIONS, _before_options(self)))
        row.update(zip(OPTION_NAMES, _options_of(self.options)))
        for name, default, value in zip(_SET_ONLY_NAMES, _SET_ONLY_DEFAULTS, _set_only(self)):
            if value is not default:
                row[name] = value
        return row

    @classmethod
    def from_json(cls, data: Any, path: str = "metrics row") -> MetricsRow:
        """A row read back from the JSON object ``data`` (a line of a run's ``metrics.jsonl``, or a row of the
        protocol's columns), as the module's docstring says; UnreadableValue says why one cannot be, naming what is
        wrong from ``path``."""
        if not isinstance(data, dict):
            raise UnreadableValue(f"{path}: expected a JSON object, got {shown(data)}")
        values: dict[str, Any] = {"options": _options(data, path)}
        for name, annotation, accepted, plain, plain_items, default in _READ:
            if name not in data:
                if default is not MISSING:
                    continue
                if _NULL not in accepted:
                    raise UnreadableValue(f"{path}: missing field {name!r}")
                values[name] = None
            elif data[name] is None and float in accepted and (_NULL not in accepted or default is None):
                values[name] = math.nan  # written as null because it was not finite
            else:
                values[name] = _read(annotation, plain, plain_items, data[name], path, name)
        return cls(**values)


def _read(annotation: Any, plain: frozenset[type], plain_items: frozenset[type], value: Any, path: str, name: str) -> Any:
    """``value`` read as ``annotation`` (typed_json's ``read_value``). A value whose type is one of the field's
    ``plain`` ones, or an object whose every value's type is one of ``plain_items`` (a ``dict[str, float | None]``
    of numbers), within typed_json's bounds, is what typed_json returns it as: taken as it is, without the walk
    through its rules that made reading a row cost two to three times the JSON's own reading."""
    if _taken_as_it_is(value, plain) or (
            plain_items and type(value) is dict and all(_taken_as_it_is(item, plain_items) for item in value.values())):
        return value
    return read_value(annotation, value, f"{path}.{name}")


def _taken_as_it_is(value: Any, plain: frozenset[type]) -> bool:
    kind = type(value)
    return kind in plain and (kind is not float or math.isfinite(value)) and (kind is not int or -MAX_INT < value < MAX_INT)


def _options(data: dict[str, Any], path: str) -> LiveOptions:
    """The live options a row holds, each a JSON scalar; one the row lacks at its default."""
    given = {name: _read(JsonScalar, _SCALARS, _NOTHING, data[name], path, name) for name in OPTION_NAMES if name in data}
    return LiveOptions(**given)


_SCALARS = frozenset({str, int, float, bool, _NULL})
_NOTHING: frozenset[type] = frozenset()


def _fields_read() -> tuple[tuple[str, Any, tuple, frozenset[type], frozenset[type], Any], ...]:
    """(name, annotation, the types a JSON value of it is read as, those of them a value is taken as it is, those
    of an object's values where it is an object of scalars, default) of each field but the options."""
    hints = typing.get_type_hints(MetricsRow)
    read = []
    for spec in fields(MetricsRow):
        if spec.name != "options":
            accepted = accepted_types(hints[spec.name])
            items = [accepted_types(typing.get_args(kind)[1]) for kind in accepted if typing.get_origin(kind) is dict]
            plain_items = frozenset(items[0]) if items and set(items[0]) <= _SCALARS else _NOTHING
            read.append((spec.name, hints[spec.name], accepted, frozenset(accepted) & _SCALARS, plain_items, spec.default))
    return tuple(read)


#: (name, default or MISSING) of each field, in the order the JSON has them
_WRITTEN = tuple((spec.name, spec.default) for spec in fields(MetricsRow))
#: the fields a row's JSON has only where they are set (not their default: None, or False)
SET_ONLY = frozenset(name for name, default in _WRITTEN if default is not MISSING)
_BEFORE_OPTIONS = tuple(name for name, _ in _WRITTEN[: [name for name, _ in _WRITTEN].index("options")])
_SET_ONLY_NAMES = tuple(name for name, default in _WRITTEN if default is not MISSING)
_SET_ONLY_DEFAULTS = tuple(default for _, default in _WRITTEN if default is not MISSING)
_before_options, _options_of, _set_only = attrgetter(*_BEFORE_OPTIONS), attrgetter(*OPTION_NAMES), attrgetter(*_SET_ONLY_NAMES)


#: every key of a row's JSON, and so every column of a metrics batch: the fields, the options flat among them
_COLUMNS = frozenset(name for name, _ in _WRITTEN if name != "options") | frozenset(OPTION_NAMES)


def column(name: str) -> str:
    """``name``, a column of the metrics rows (a field of ``MetricsRow``, or a live option's name). A reader of the
    columns names them through this, so that a renamed field fails where it is read, as the reader loads, and not as
    an empty chart."""
    if name not in _COLUMNS:
        raise KeyError(f"{name!r} is no column of the metrics rows")
    return name


def columns_of(rows: list[MetricsRow], leave_out: tuple[str, ...] = ()) -> dict[str, list[Any]]:
    """The JSON objects of ``rows`` as columns, each key -> its values in order, less the fields ``leave_out``: a
    field a row does not write is null in its column, one no row writes has none. Read field by field, not row by
    row through ``json_object``: a sender makes these of up to a thousand rows at a time."""
    columns: dict[str, list[Any]] = {}
    for name, default in _WRITTEN:
        if name in leave_out:
            continue
        if name == "options":
            options = [row.options for row in rows]
            columns.update((option, list(map(attrgetter(option), options))) for option in OPTION_NAMES)
            continue
        values = list(map(attrgetter(name), rows))
        if default is MISSING:
            columns[name] = values
        elif any(value is not default for value in values):
            columns[name] = [None if value is default else _json_value(value) for value in values]
    return columns


def _json_value(value: Any) -> Any:
    """A row's value as its line holds it: a payload (``phases``) as the object of its fields, so that a batch
    is the same values before and after it travels (the others are JSON values already)."""
    return asdict(value) if is_dataclass(value) else value
_READ = _fields_read()
