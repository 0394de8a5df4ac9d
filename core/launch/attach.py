"""``torchlab-tui attach [RUN]``: list this user's runs, and open the workbench on a running one.

A run detached with ``d`` (or by a hang-up: the SSH connection dropped, the tmux pane was killed)
keeps training; its entry in the runtime directory (core/wire/runtime.py) says where it is. ``attach``
with no argument lists every run, and opens the one live run if there is exactly one; ``attach RUN``
opens RUN, named by its name (a unique prefix will do) or by its run directory. A run that ended
while nobody was attached is reported once, with its run directory, and its entry removed.

A second app on a run that already has one is refused (by the trainer, and said here first), exit 2 as other
refusals and bad input: one app controls a run, so ``q`` in one app never surprises another. ``attach --view`` opens a read-only viewer
instead, beside it: any number of them, the same token (only the run's owner can view), keys that would
change the run refused on the spot, and quitting one leaves the run as it is.

Every string it prints that came from a runtime entry or from the trainer (a run's name, its directory, its
workload, a refusal) goes through ``printable`` (core/errors.py): control characters are shown escaped, never sent to
the terminal. An entry that is not one (corrupt, a FIFO, a link) is skipped with one line on stderr.

Standard library and the app only: no torch in this process.
"""

from __future__ import annotations

import argparse
import gc
import os
import signal
import sys
import time
from pathlib import Path

from torchlab.core.errors import EXIT_OK, EXIT_USAGE, TorchlabError, printable
from torchlab.core.launch.arguments import command_parser
from torchlab.core.launch.serve import SERVED_BY_PARENT
from torchlab.core.launch.terminal import redirected_streams, require_terminal
from torchlab.core.wire.run_status import RunStatus
from torchlab.core.wire.runtime import RunEntry, die_with_parent, find_run, read_runs



def main(argv: list[str]) -> int:
    parser = command_parser("attach")
    parser.add_argument("run", nargs="?", help="the run's name (or a unique prefix) or its run directory")
    parser.add_argument("--view", action="store_true",
                        help="watch it read-only, beside the app that controls it (any number of viewers; quitting one leaves the run as it is)")
    args = parser.parse_args(argv)
    try:
        return _attach(args)
    except TorchlabError as error:  # a runtime directory that is not safe to use, say
        print(f"torchlab-tui attach: {printable(error)}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # `torchlab-tui attach | head -3`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush does not fail again
        return EXIT_OK


def _attach(args: argparse.Namespace) -> int:
    if args.run is None:
        entries, skipped = read_runs()
        for line in skipped:
            print(f"torchlab-tui attach: skipped {printable(line)}; it is not an entry torchlab wrote: remove it.", file=sys.stderr)
        print(format_runs(entries) if entries else "No runs: start one with `torchlab-tui WORKLOAD`.")
        forget_gone_runs(entries)
        live = live_runs(entries)
        if len(live) != 1:
            if len(live) > 1:
                print("\nSeveral runs are live: `torchlab-tui attach NAME` opens one.")
            return EXIT_OK
        if redirected_streams():  # a listing piped or captured: the app would draw into the pipe
            print(f"\nNot opened (the output is not a terminal): `torchlab-tui attach {printable(live[0].endpoint.name)}` from one.")
            return EXIT_OK
        entry = live[0]
    else:
        try:
            entry = find_run(args.run)
        except LookupError as error:
            print(f"torchlab-tui attach: {printable(error)}", file=sys.stderr)
            return EXIT_USAGE
    return open_run(entry, view=args.view)


def open_run(entry: RunEntry, *, view: bool = False) -> int:
    """The workbench on ``entry``'s trainer, or, if that trainer has ended, what became of it."""
    info = entry.info
    name, run_dir = printable(entry.endpoint.name), printable(info.get("run_dir"))
    if entry.ended:
        print(report_ended(entry))
        return EXIT_OK
    if info.get("attached") and not view:
        print(f"torchlab-tui attach: another app is attached to {name}; quit or detach it first (one app controls a run), "
              f"or watch it read-only: torchlab-tui attach --view {name}",
              file=sys.stderr)
        return EXIT_USAGE  # a refusal, as bad input is: nothing ran, nothing failed
    step = f"{info.get('step', 0)}/{info['steps']}" if info.get("steps") else f"{info.get('step', 0)}"
    require_terminal(f"torchlab-tui attach {name}", f"{name} is {printable(entry.state)} at step {step}; its run "
                                                    f"directory is {run_dir}.")
    if os.environ.get(SERVED_BY_PARENT):  # a browser tab's app (torchlab-tui serve): it ends with the server
        die_with_parent(signal.SIGKILL)
    gc.disable()  # until tune_garbage_collection(): the app's imports are all kept, nothing to collect
    try:
        from torchlab.tui.app import TorchlabApp, tune_garbage_collection
        from torchlab.tui.link import ProcessLink

        link = ProcessLink.attach(entry, view=view)
        app = TorchlabApp(lambda: link, workload=info.get("workload"))
    except BaseException:
        gc.enable()
        raise
    tune_garbage_collection()  # freezes what exists, then enables the collector
    app.run()
    if link.refused is not None:
        print(f"torchlab-tui attach: {name}: {printable(link.refused)}", file=sys.stderr)
        return EXIT_USAGE
    if view:
        print(f"Stopped viewing {name}; it goes on as it was.", file=sys.stderr)
    elif app.run_state.detached:
        print(f"Detached from {name}: {printable(app.run_state.after_detach)}. `torchlab-tui attach {name}` reconnects.", file=sys.stderr)
    print(f"Run directory: {run_dir}", file=sys.stderr)
    for line in app.how_it_ended(Path(str(info.get("run_dir")))):  # what the app that started it would have said
        print(printable(line), file=sys.stderr)
    return app.return_code or EXIT_OK


def live_runs(entries: list[RunEntry]) -> list[RunEntry]:
    """The runs whose trainer is still there: with no RUN named, ``attach`` and ``stop`` take the one there is."""
    return [entry for entry in entries if entry.live]


def report_ended(entry: RunEntry) -> str:
    """What became of a run that is no longer running, said once: its entry is removed (``attach`` lists it no more)."""
    info = entry.info
    state = entry.state
    how = (f"{state} at step {info.get('step')}" if state != RunStatus.GONE
           else f"gone without a word at step {info.get('step')} (killed?); its last checkpoint is in the run directory")
    entry.endpoint.remove()
    return f"{printable(entry.endpoint.name)}: {printable(how)}.\nRun directory: {printable(info.get('run_dir'))}"


def forget_gone_runs(entries: list[RunEntry]) -> None:
    """Runs whose trainer died without a word (``kill -9``, killed while starting) are listed once, then
    their files go: otherwise they would stay in every listing as "gone" forever."""
    gone = [entry for entry in entries if entry.state == RunStatus.GONE]
    for entry in gone:
        entry.endpoint.remove()
    if gone:
        print(f"\n{'A run' if len(gone) == 1 else f'{len(gone)} runs'} ended without a word (killed?): listed this once. "
              "A run directory keeps its last checkpoint: `torchlab-tui --resume RUN_DIR` continues it.")


#: The listing's width: a terminal of 80 columns, as over SSH on a laptop.
LISTING_WIDTH = 80


def format_runs(entries: list[RunEntry]) -> str:
    """One line a run (name, step, state, how long ago it started) and, under it, its workload and directory:
    the listing fits 80 columns whatever the paths (a long one runs past the edge on its own line, not into
    the next column). Where a long name (a workload's file name is part of it) leaves no room for the columns,
    each run's name has a line of its own and its step, state and start the line under it."""
    rows = [("NAME", "STEP", "STATE", "STARTED")]
    places = []
    now = time.time()
    for entry in entries:
        info = entry.info
        steps = f"/{info['steps']}" if info.get("steps") else ""
        state = entry.state + (", app attached" if entry.live and info.get("attached") else "")
        rows.append((printable(entry.endpoint.name), f"{info.get('step', 0)}{steps}", printable(state),
                     _since(now - float(info.get("started") or now)) + " ago"))
        places.append(f"  {printable(info.get('workload', '') or '?')} · {printable(_home(str(info.get('run_dir', ''))))}")
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    if sum(widths) + 2 * (len(widths) - 1) > LISTING_WIDTH:
        lines = []
        for (name, step, state, started), place in zip(rows[1:], places):
            lines += [name, f"  step {step} · {state} · started {started}", place]
        return "\n".join(lines)
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(rows[0], widths)).rstrip()]
    for row, place in zip(rows[1:], places):
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
        lines.append(place)
    return "\n".join(lines)


def _home(path: str) -> str:
    """``~/runs/x`` for a path under the home directory: shorter, and still one a shell reads back."""
    home = os.path.expanduser("~")
    return "~" + path[len(home):] if home not in ("", "/") and (path == home or path.startswith(home + os.sep)) else path


def _since(seconds: float) -> str:
    minutes = int(seconds // 60)
    if minutes < 1:
        return f"{int(seconds)}s"
    if minutes < 60:
        return f"{minutes}m"
    return f"{minutes // 60}h{minutes % 60:02d}m"
