"""How the app leaves: a quit stops the trainer after its final checkpoint, a detach (``d``, a viewer's
leaving, a hang-up) leaves it training; and the status the app exits with, which tells how the run ended.

A part of ``TorchlabApp`` (app.py), split off so that each module holds one job; a mixin because Textual calls
``on_unmount`` and the ``quit`` action on the app itself.
"""

from __future__ import annotations

import asyncio
import errno
import os
import sys
import termios
import threading
from pathlib import Path

from textual import work

from torchlab.core.errors import EXIT_FAILED, EXIT_NONFINITE, EXIT_OK, EXIT_USAGE
from torchlab.core.wire.run_status import RunStatus

#: After a hang-up, how long the app waits for the trainer to acknowledge the detach before it goes.
HANGUP_DETACH_TIMEOUT_S = 3.0


class Leaving:
    """The ways out of ``TorchlabApp``: quit, detach, a hang-up, and the exit status."""

    async def action_quit(self) -> None:
        self._leave(detach=False)

    def _leave(self, *, detach: bool) -> None:
        """Close the link off the UI thread (a final checkpoint can take seconds), then exit.

        A second ``q`` while the trainer is still saving exits at once; the link's own clean-up
        (the trainer's parent-death handling) still ends the trainer.
        """
        if self._leaving:
            self.exit(return_code=self.outcome_exit_code())
            return
        self._leaving = True
        if self.link is None or self._link_closed:
            self.exit(return_code=self.outcome_exit_code())
            return
        if self.read_only:  # a viewer leaves; the run goes on as it is
            self._close_link(True)
            return
        if detach:
            where = self.link.run_dir or self.run_state.run_dir
            self.notify(f"detached from {where}: {self.run_state.after_detach}")
        elif self.run_state.hung_at is not None:  # no boundary will come: the trainer ends the run where it hangs
            self.notify(f"ending the run hung at step {self.run_state.hung_at}: no final checkpoint (its ranks are stuck)…")
        else:
            self.notify("stopping the trainer: saving a final checkpoint… (q again to leave at once)")
        self._close_link(detach)

    @work(exclusive=True, group="link-close", exit_on_error=False)
    async def _close_link(self, detach: bool) -> None:
        link = self.link
        self._link_closed = True
        try:
            if link is not None:
                # In a thread: the trainer's final checkpoint can take seconds, and the UI keeps drawing meanwhile.
                await asyncio.to_thread(link.close, detach=detach)
        except Exception as error:  # said on the way out: the terminal is all that is left to tell
            self.exit(1, 1, f"torchlab-tui: could not stop the trainer cleanly: {error}")
            return
        # What the trainer said as it ended is folded in before the status and the summary are read from the state:
        # a stop that ended a hung run is a failure (its error names the checkpoint to resume from), not "stopped".
        if link is not None:
            self._unfolded.extend(link.drain())
        self.run_state.apply_all(self._unfolded)
        self._unfolded.clear()
        self.exit(return_code=self.outcome_exit_code())

    def outcome_exit_code(self) -> int:
        """The app's exit status tells how the run ended, as a headless run's does: 0 finished, stopped or
        detached; 1 failed (or its trainer could not be started: a full disk); 2 the trainer (or this app, before
        starting it) refused its input (a workload, a setting, the runtime directory); 3 non-finite."""
        state = self.run_state
        if state.detached or self.read_only:  # a viewer's leaving says nothing of the run
            return EXIT_OK
        if self._start_failed_status is not None:
            return self._start_failed_status
        if state.failure is None:
            return EXIT_OK
        if state.failure.kind == RunStatus.NONFINITE:
            return EXIT_NONFINITE
        if self.link is not None and self.link.trainer_exit_code == EXIT_USAGE:
            return EXIT_USAGE
        return EXIT_FAILED

    def how_it_ended(self, run_dir: Path) -> list[str]:
        """What the terminal says once the app has gone, whichever app it was (the one that started the run, or
        ``attach``'s) and however it left (``q`` while training or on the error screen), as a headless run says it:
        how the run ended, and the line that continues it (``how_to_continue``). Nothing for a viewer, a detach or a
        trainer that never started: the run goes on, or there is none, and their own lines say so."""
        state = self.run_state
        if state.detached or self.read_only or self._start_failed_status is not None:
            return []
        failure = state.failure
        if failure is not None:
            step = failure.step if failure.step is not None else state.step
            what = "Stopped on a non-finite value" if failure.kind == RunStatus.NONFINITE else "Failed"
            said = failure.message.strip().splitlines()[0] if failure.message.strip() else "see trainer.log"
            ended = f"{what} at step {step}: {said}"
        elif state.total_steps is not None and state.step >= state.total_steps:
            ended = f"Finished at step {state.step}."
        else:
            ended = f"Stopped at step {state.step}" + (f" of {state.total_steps}." if state.total_steps else ".")
        continuing = self.how_to_continue(run_dir)
        return [ended] if continuing is None else [ended, continuing]

    def how_to_continue(self, run_dir: Path) -> str | None:
        """How to continue a run that stopped or failed before its last step from its last checkpoint, as a
        headless run says it: the exact ``torchlab-tui --resume`` line. None where there is nothing to continue
        (the run finished, was detached, or left no checkpoint) or this app only watched it."""
        state = self.run_state
        if state.detached or self.read_only or self._start_failed_status is not None:
            return None
        if state.failure is None and (state.total_steps is None or state.step >= state.total_steps):
            return None
        if not (run_dir / "checkpoints" / "last.pt").exists():
            return None
        resume = f"torchlab-tui --resume {run_dir.absolute()}"
        if state.failure is not None:
            return f"Its last checkpoint is kept; continue from it with {resume}"
        return f"Stopped before its {state.total_steps} steps; continue it with {resume}"

    def on_unmount(self) -> None:
        # Any other way out (ctrl+c, an exception): the trainer still gets told, so no orphan is left;
        # unless the terminal is gone, which is a hang-up whichever noticed first: then it trains on.
        if self._hangup_thread is not None:
            self._hangup_thread.join(HANGUP_DETACH_TIMEOUT_S + 2.0)
        elif self.link is not None and not self._link_closed:
            if terminal_hung_up():
                self._detach_after_hangup()
            else:
                self._link_closed = True
                self.link.close(detach=False)

    # ------------------------------------------------------------------ hang-up

    def _on_hangup(self, signum: int, frame: object) -> None:
        """SIGHUP: the SSH connection dropped or the tmux pane was killed. Detach, then go.

        A signal handler takes no locks and touches no widget: a thread asks the trainer to go on.
        """
        if self._hangup_thread is None:
            self._hangup_thread = threading.Thread(target=self._detach_after_hangup, name="torchlab-hangup", daemon=True)
            self._hangup_thread.start()

    def _detach_after_hangup(self) -> None:
        link = self.link
        if link is not None and not self._link_closed:
            self._link_closed = True
            detached = link.detach_and_wait(HANGUP_DETACH_TIMEOUT_S)
            link.close(detach=detached)  # not acknowledged (an old trainer): it stops, as a quit would
        if terminal_hung_up():
            # No screen is left to restore, and Textual's goodbye to the terminal would block on it
            # forever: the trainer has its answer, so the app ends here.
            os._exit(0)
        try:
            self.call_from_thread(self.exit, 0)
        except RuntimeError:  # the app had already stopped
            pass


def terminal_hung_up() -> bool:
    """True when this process's terminal has hung up (every terminal call fails with EIO)."""
    for stream in (sys.__stdin__, sys.__stdout__):
        try:
            termios.tcgetattr(stream.fileno())
        except termios.error as error:
            if error.args and error.args[0] == errno.EIO:
                return True
        except (AttributeError, OSError, ValueError):  # no such stream, or not a file
            continue
    return False
