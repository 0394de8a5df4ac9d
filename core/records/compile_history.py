"""What torch.compile cost a whole run, over its processes: the one reading of the ``compile_report`` events that the
impact table's payback (core/analysis/impact.py) and ``compare`` (tui/run_history.py) share.

A report counts its own process's compiling (core/engine/compile_watch.py: the boundary's compile and the steps that
compiled again), and every process compiles again what the run had on (a resume, a world-size relaunch), so the run's
compile time is each process's last report's, added up. The newest report says the breaks and recompiles: a resumed
process meets the same code and reports them again.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torchlab.core.wire.compile_report import CompileReport
from torchlab.core.wire.events import RunStarted
from torchlab.core.wire.typed_json import UnreadableValue, read_object


class RunCompileTime:
    """The run's compile time so far (``seconds``) and its newest report, fed each process's start and reports in the
    order they were made: live, or from the journal (``read``)."""

    def __init__(self) -> None:
        self.newest: CompileReport | None = None
        self._earlier_processes_s = 0.0
        self._this_process_s = 0.0

    @property
    def seconds(self) -> float:
        return self._earlier_processes_s + self._this_process_s

    def process_started(self) -> None:
        self._earlier_processes_s += self._this_process_s
        self._this_process_s = 0.0

    def reported(self, report: CompileReport) -> None:
        self.newest, self._this_process_s = report, report.compile_s

    def read(self, record: dict[str, Any]) -> None:
        """A record of ``events.jsonl``: a process's start or a compile report (others, and a report this version
        cannot read, are left)."""
        if record.get("event") == RunStarted.journal_event():
            self.process_started()
        elif record.get("event") == CompileReport.journal_event():
            fields = {key: value for key, value in record.items() if key not in ("event", "time")}
            try:
                self.reported(read_object(CompileReport, fields, "events.jsonl compile_report", nested=False))
            except UnreadableValue:
                pass  # a record of another version, or edited by hand: the compile time stays what was read

    @classmethod
    def of(cls, records: Iterable[dict[str, Any]]) -> RunCompileTime:
        """The run's compile time from its journal's records, in their order."""
        compiled = cls()
        for record in records:
            compiled.read(record)
        return compiled
