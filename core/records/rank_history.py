"""What held a run's ranks back, over the whole run: the one reading of its ``straggler`` and ``hang`` events that
``compare`` (tui/run_history.py) and a TensorBoard export (core/launch/export.py) share.

A straggler verdict holds from the step it was said at until a verdict that clears it (or the run's end); a rank said
again after being cleared is a second stretch. A hang is said once per step that overran.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from torchlab.core.wire.codec import Message
from torchlab.core.wire.hang import Hang
from torchlab.core.wire.straggler import Straggler
from torchlab.core.wire.typed_json import UnreadableValue, read_object

#: the events this reads, by their journal name
RANK_EVENTS: dict[str, type[Message]] = {Straggler.journal_event(): Straggler, Hang.journal_event(): Hang}


def rank_event(record: dict[str, Any]) -> Straggler | Hang | None:
    """A record of ``events.jsonl`` as its straggler or hang event; None for any other, or one this version cannot read
    (another version's, or edited by hand)."""
    kind = RANK_EVENTS.get(record.get("event", ""))
    if kind is None:
        return None
    fields = {key: value for key, value in record.items() if key not in ("event", "time")}
    try:
        return read_object(kind, fields, f"events.jsonl {record['event']}", nested=False)
    except UnreadableValue:
        return None


@dataclass
class RankHistory:
    """Each stretch a rank straggled ((rank, host, part, first step, last step or None while it still did)) and each
    hung step, in the order said."""

    stretches: list[list[Any]] = field(default_factory=list)
    hangs: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, records: Iterable[dict[str, Any]]) -> RankHistory:
        history = cls()
        for record in records:
            event = rank_event(record)
            if isinstance(event, Hang):
                history.hangs.append(event.step)
            elif isinstance(event, Straggler):
                history._straggler(event)
        return history

    def _straggler(self, event: Straggler) -> None:
        open_stretch = next((stretch for stretch in reversed(self.stretches)
                             if stretch[0] == event.rank and stretch[4] is None), None)
        if event.cleared:
            if open_stretch is not None:
                open_stretch[4] = event.step
        elif open_stretch is None:
            self.stretches.append([event.rank, event.host, event.part, event.since_step, None])

    def sentence(self) -> str | None:
        """"rank 1 (node-b) straggled steps 88–200 (data wait); hung at step 412", or None where nothing held the ranks
        back."""
        said = []
        for rank, host, part, first, last in self.stretches:
            where = f" ({host})" if host else ""
            steps = f"steps {first}–{last}" if last is not None else f"from step {first}"
            said.append(f"rank {rank}{where} straggled {steps} ({part})")
        if self.hangs:
            said.append(f"hung at step{'s' if len(self.hangs) > 1 else ''} {', '.join(str(step) for step in self.hangs)}")
        return "; ".join(said) or None
