"""What compiling bought, in the impact row of the segment that turned compile on: its compile time against the time
it saves a step, and the step it pays back at; and its graph breaks (core/engine/compile_watch.py's report).

"compiled in 41.0 s, saves 6.2 ms a step: pays back at step 6,620 of 20,000". Said only where the impact table judged
the speed (the two segments' step-time intervals do not overlap: ``ImpactSegment.speedup``): a saving the noise could
have made pays back at no step anyone can name. The compile time is all the run spent compiling (at the boundaries
and in steps that compiled again, in each of its processes: core/records/compile_history.py), which the impact table
leaves out of the step times.
"""

from __future__ import annotations

import math

from torchlab.core.records.compile_history import RunCompileTime
from torchlab.core.wire.compile_report import short_path
from torchlab.core.wire.payloads import ImpactSegment


def payback_words(row: ImpactSegment, baseline: ImpactSegment | None, compiled: RunCompileTime,
                  total_steps: int | None) -> str | None:
    """The words for ``row`` where it is the segment compile came on in against an uncompiled ``baseline``, else None.
    The compile time is the run's, every process's (a resumed process compiles again what the run had)."""
    report = compiled.newest
    if report is None or baseline is None or not row.options.get("compile") or baseline.options.get("compile"):
        return None
    seconds = compiled.seconds
    words = [f"compiled in {seconds:.1f} s"]
    before, after = baseline.median_step_time_s, row.median_step_time_s
    if row.speedup is not None and before is not None and after is not None:
        saved = before - after
        if saved > 0:
            at = row.first_step + math.ceil(seconds / saved)
            of = f" of {total_steps:,}" if total_steps else ""
            late = "; the run ends first" if total_steps and at > total_steps else ""
            words.append(f"saves {saved * 1000:.3g} ms a step: pays back at step {at:,}{of}{late}")
        else:
            words.append(f"{-saved * 1000:.3g} ms slower a step: never pays back")
    if report.breaks:
        places = ", ".join(f"{short_path(entry.file)}:{entry.line}" for entry in report.breaks[:3])
        words.append(f"{len(report.breaks)} graph break{'s' if len(report.breaks) != 1 else ''} ({places})")
    return ", ".join(words[:2]) + ("; " + "; ".join(words[2:]) if words[2:] else "")
