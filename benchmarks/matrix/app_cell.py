"""The matrix's run events that happen in the app, driven through Textual's Pilot against the real trainer process:

- ``app_detach_attach``: the app pauses the run at its first boundary (the cell's ``--at 1:`` change applied there),
  detaches (``d``); ``attach`` opens a second app that must replay that change with its step, resumes the run
  (``space``) and sees it finish; ``q``.
- ``app_view``: a controller (the link, no screen) pauses the run at its first boundary; ``attach --view`` opens the
  read-only app, which must replay the change, refuse the cell's option key and ``space`` in one line each, and leave
  with ``q`` while the run waits; the controller resumes it to the end.
- ``app_error_restart``: the app's trainer is killed (SIGKILL) once a checkpoint and a few rows have landed; the error
  screen must name the checkpoint ``last.pt`` points at; the cell's option is set there (its key; a number typed into
  the prompt) and ``r`` restarts from that checkpoint with it, to the run's end.
- ``app_what_fits``: the app pauses the run at its first boundary (the cell's change applied there) and opens what
  fits (``F``); the settings in force must be predicted (or why not said) and listed first; resumed, the run measures
  memory every step, so that the prediction is checked against it: within 10 % where it was predicted (the issue's
  goal on a CPU), and the journal holds both. A compiled model is predicted as it runs eagerly (what inductor saves
  for backward is its own: the matrix found -21 % to +12 % on four models), so there only the correction is checked:
  the median of measured over predicted, which scales the predictions after it.

    python -m benchmarks.matrix.app_cell EVENT RUN_DIR OPTION VALUE -- WORKLOAD FLAGS...

OPTION is ``none`` or the live option the cell changes, VALUE its value as typed. What broke is printed, one line
each, and the exit status is 1; every expectation held: 0. The run's files are then the matrix's to check.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path

from benchmarks.matrix.cell import KILL_AFTER  # a checkpoint and this many rows: a kill mid-run, with a restart point
from torchlab.core.wire import protocol as p
from torchlab.core.options import OPTIONS_BY_NAME, Number
from torchlab.core.wire.run_status import RunStatus
from torchlab.core.wire.runtime import find_run
from torchlab.tui.app import TorchlabApp
from torchlab.tui.link import ProcessLink, last_checkpoint
from torchlab.tui.screens.error_screen import ErrorScreen
from torchlab.tui.widgets.event_log import EventLog

SIZE = (120, 40)
WAIT_S = 240.0

problems: list[str] = []


def expect(condition: bool, problem: str) -> None:
    if not condition:
        problems.append(problem)


async def until(pilot, condition, what: str, failure_expected: bool = False) -> None:
    """Wait for ``condition``; a run that fails meanwhile (the error screen) is the finding, said at once."""
    deadline = time.monotonic() + WAIT_S
    while not condition():
        screen = pilot.app.screen
        if not failure_expected and isinstance(screen, ErrorScreen):
            raise TimeoutError(f"the run failed while the cell waited for {what}: {screen.failure.message[:300]}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {WAIT_S:.0f} s for {what}")
        await pilot.pause(0.01)


def rows(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return path.read_text().count("\n") if path.exists() else 0


def applied_so_far(run_dir: Path) -> list[dict]:
    from torchlab.core.records.option_history import changes_recorded

    path = run_dir / "events.jsonl"
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    return [e for e in events if e.get("event") == "option_applied" and changes_recorded(e)]


def replayed(app, run_dir: Path, who: str) -> None:
    """Every change the journal holds so far is a line of the app's event log, with its step."""
    lines = app.query_one(EventLog).lines_written
    for event in applied_so_far(run_dir):
        expect(any(f"{event['option']} = " in line and f"step {event['step']}" in line for line in lines),
               f"{who} does not replay {event['option']} applied at step {event['step']} (log: {lines[-6:]})")


async def detach_attach(run_dir: Path, flags: list[str], option: str) -> None:
    first = TorchlabApp(lambda: ProcessLink(run_dir, flags), workload=flags[0])
    async with first.run_test(size=SIZE) as pilot:
        await pilot.press("space")  # queued while the trainer starts: paused at its first boundary
        await until(pilot, lambda: first.run_state.state == RunStatus.PAUSED, "the run to pause")
        await pilot.press("d")
        await until(pilot, lambda: not first.is_running, "the app to detach")
    expect(first.return_code == 0, f"the detaching app exited {first.return_code}")

    entry = find_run(str(run_dir))
    second = TorchlabApp(lambda: ProcessLink.attach(entry), workload=flags[0])
    async with second.run_test(size=SIZE) as pilot:
        state = second.run_state
        await until(pilot, lambda: state.welcomed and state.state == RunStatus.PAUSED, "the attached app to see the pause")
        await pilot.pause(0.2)  # the replayed history drains on the app's timer
        replayed(second, run_dir, "attach")
        await pilot.press("space")
        await until(pilot, lambda: state.state == RunStatus.FINISHED, "the run to finish under the attached app")
        await pilot.press("q")
        await until(pilot, lambda: not second.is_running, "the attached app to quit")
    expect(second.return_code == 0, f"the attached app exited {second.return_code}")


async def view(run_dir: Path, flags: list[str], option: str) -> None:
    controller = ProcessLink(run_dir, [*flags])
    controller.start()
    controller.send(p.PauseCommand())
    seen: list[p.Message] = []

    def said(kind, test=lambda m: True) -> bool:
        seen.extend(controller.drain())
        return any(isinstance(m, kind) and test(m) for m in seen)

    deadline = time.monotonic() + WAIT_S
    while not said(p.State, lambda m: m.state == RunStatus.PAUSED):
        if said(p.State, lambda m: m.state == RunStatus.FAILED):
            raise TimeoutError("the controlled run failed before it paused")
        if time.monotonic() > deadline:
            raise TimeoutError("waited for the controlled run to pause")
        await asyncio.sleep(0.01)
    entry = find_run(str(run_dir))
    viewer = TorchlabApp(lambda: ProcessLink.attach(entry, view=True), workload=flags[0])
    key = OPTIONS_BY_NAME[option].key if option != "none" else "a"
    async with viewer.run_test(size=SIZE) as pilot:
        state = viewer.run_state
        await until(pilot, lambda: state.welcomed and state.state == RunStatus.PAUSED, "the viewer to see the pause")
        await pilot.pause(0.2)
        replayed(viewer, run_dir, "attach --view")
        await pilot.press(key, "space")
        await pilot.pause(0.2)
        refused = [line for line in viewer.query_one(EventLog).lines_written if "read-only view" in line]
        expect(len(refused) == 2, f"attach --view refused {len(refused)} of its 2 keys ({key!r}, space) in a line: {refused}")
        await pilot.press("q")
        await until(pilot, lambda: not viewer.is_running, "the viewer to leave")
    expect(viewer.return_code == 0, f"the viewer exited {viewer.return_code}")
    # what a key sends is stamped "app" by the worker; the run's own changes say "start", "--at" or "resumed"
    expect(not said(p.OptionApplied, lambda m: m.source == "app"), "a viewer's key changed the run")
    controller.send(p.ResumeCommand())
    while not said(p.State, lambda m: m.state == RunStatus.FINISHED):
        if time.monotonic() > deadline:
            raise TimeoutError("waited for the controlled run to finish")
        await asyncio.sleep(0.05)
    controller.close()
    expect(controller.process.wait(timeout=60) == 0, f"the trainer exited {controller.process.returncode}")


async def error_restart(run_dir: Path, flags: list[str], option: str, value: str) -> None:
    links: list[ProcessLink] = []

    def started() -> ProcessLink:
        links.append(ProcessLink(run_dir, flags))
        return links[-1]

    app = TorchlabApp(started, workload=flags[0])
    checkpoints = run_dir / "checkpoints"
    async with app.run_test(size=SIZE) as pilot:
        link = links[0]
        await until(pilot, lambda: (checkpoints / "last.pt").exists() and rows(run_dir) >= KILL_AFTER
                    or app.run_state.state == RunStatus.FINISHED, "a checkpoint and a few rows")
        expect(app.run_state.state != RunStatus.FINISHED, "the run finished before it could be killed")
        os.kill(link.pid, signal.SIGKILL)
        await until(pilot, lambda: isinstance(app.screen, ErrorScreen) and app.screen.is_mounted, "the error screen",
                    failure_expected=True)
        point = last_checkpoint(checkpoints)
        keys = str(app.screen.query_one("#error-keys").content)
        expect(point is not None and f"r restarts from {point[0]}" in keys,
               f"the error screen says {keys!r}; last.pt is {point}")
        if option != "none":
            live = OPTIONS_BY_NAME[option]
            if isinstance(live, Number):
                await pilot.press(live.key)
                await pilot.pause(0.1)
                await pilot.press("ctrl+a", *["delete"] * 20, *value, "enter")
            else:
                for _ in range(len(getattr(live, "choices", (0, 1)))):  # the key cycles: to the value, or round
                    if live.format(app.screen.value(option)) == value:
                        break
                    await pilot.press(live.key)
                    await pilot.pause(0.05)
            expect(live.format(app.screen.value(option)) == value,
                   f"the error screen's {live.key!r} set {option} to {live.format(app.screen.value(option))}, not {value}")
        await pilot.press("r")
        await until(pilot, lambda: app.run_state.state == RunStatus.FINISHED, "the restarted run to finish")
        await pilot.press("q")
        await until(pilot, lambda: not app.is_running, "the app to quit")
    expect(app.return_code == 0, f"the app exited {app.return_code} after a restart that finished")


async def what_fits(run_dir: Path, flags: list[str]) -> None:
    from textual.widgets import DataTable

    from torchlab.tui.screens.fits_screen import FitsScreen

    # low: the forecaster answers beside the other cells' processes; every step measured: the check comes at once
    app = TorchlabApp(lambda: ProcessLink(run_dir, [*flags, "--forecast-priority", "low", "--memory-every", "1"]),
                      workload=flags[0])
    async with app.run_test(size=SIZE) as pilot:
        state = app.run_state
        await pilot.press("space")  # queued while the trainer starts: paused at its first boundary
        await until(pilot, lambda: state.state == RunStatus.PAUSED, "the run to pause")
        await pilot.press("F")
        await until(pilot, lambda: state.predicted() is not None, "the settings in force predicted")
        in_force = state.predicted()
        expect(in_force.prediction is not None or bool(in_force.error),
               f"the settings in force came back neither predicted nor said why: {in_force}")
        await pilot.pause(0.1)
        if isinstance(app.screen, FitsScreen):
            table = app.screen.query_one(DataTable)
            first = str(table.get_row_at(0)[0]) if table.row_count else ""
            expect(first == "in force", f"what fits listed {first!r} first, not the settings in force")
        else:
            expect(False, f"F opened {type(app.screen).__name__}, not what fits")
        await pilot.press("escape", "space")
        await until(pilot, lambda: state.state == RunStatus.FINISHED, "the run to finish")
        await pilot.press("q")
        await until(pilot, lambda: not app.is_running, "the app to quit")
    expect(app.return_code == 0, f"the app exited {app.return_code}")
    journal = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]
    predicted = [e for e in journal if e["event"] == "memory_predicted"]
    expect(any(e["change"] == "in force" for e in predicted), "no memory_predicted for the settings in force journalled")
    checks = [e for e in journal if e["event"] == "prediction"]
    if in_force.prediction is not None and in_force.prediction.refused is None:
        expect(bool(checks), "the settings in force were predicted, trained with, and never checked (prediction)")
    ratios = []
    for check in checks:
        ratios.append(check["measured_bytes"] / check["predicted_bytes"])
        expect(check["ratio"] == statistics.median(ratios), f"the run's correction {check['ratio']} is not the median "
                                                            f"of measured over predicted so far, {ratios}")
        if "--compile" in flags:  # predicted as the model runs eagerly: what inductor saves is not (docs/will-it-fit.md)
            continue
        expect(abs(check["error"]) <= 0.10, f"a prediction {check['error'] * 100:+.1f} % from the memory measured: "
                                            f"{check['predicted_bytes']} predicted, {check['measured_bytes']} measured "
                                            f"({check['measure']}) for {check['settings']}")


def main(argv: list[str]) -> int:
    event, run_dir, option, value, separator, *flags = argv
    assert separator == "--", "usage: EVENT RUN_DIR OPTION VALUE -- WORKLOAD FLAGS..."
    run_dir = Path(run_dir)
    play = {"app_detach_attach": lambda: detach_attach(run_dir, flags, option),
            "app_view": lambda: view(run_dir, flags, option),
            "app_error_restart": lambda: error_restart(run_dir, flags, option, value),
            "app_what_fits": lambda: what_fits(run_dir, flags)}[event]
    try:
        asyncio.run(play())
    except TimeoutError as error:
        problems.append(str(error))
    for problem in problems:
        print(f"FAILED: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
