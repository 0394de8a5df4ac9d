"""The trainer process the app starts: ``python -m torchlab.core.launch.worker --run-dir DIR --socket S --token-file T -- ARGS``.

ARGS are the training flags of ``torchlab-tui`` (the same parser); the run directory is on the command
line so ``ps`` tells which run a process belongs to. The process serves its socket at once, so the
app connects while torch and the workload load, then trains and reports through the Outbox
(core/launch/outbox_reporter.py).

It never outlives its app by accident: when the app goes away without detaching (quit, crash,
``kill -9``: the parent-death signal, a ``getppid`` poll, or the socket closing, whichever comes
first), the trainer stops at the next step boundary, writes a final checkpoint and exits. After a
detach (the app's ``d``, or its hang-up) it trains on alone and waits for ``torchlab-tui attach``;
the run's entry in the runtime directory (core/wire/runtime.py) says where it is and how far it got.

This process is the run's supervisor (core/engine/ranks/supervisor.py): at world size 1 it trains itself; above that it
starts the ranks and relays rank 0's reports, and it stays the app's one endpoint across world-size
changes. Under ``torchrun`` each process runs this module as one rank: rank 0 serves the socket and
reports, the others only train.

It exits as a headless run does (core/errors.py): a TorchlabError before or at the first step is told to
the app as its paragraph and exits with its status (2 bad input, 1 a workload that called sys.exit), a run's
outcome with its own (1 failed, 3 non-finite).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchlab.core.analysis.impact import ImpactTracker
from torchlab.core.engine.parallel import preemption
from torchlab.core.errors import EXIT_OK
from torchlab.core.errors import StorageError, TorchlabError, WorkloadExited, exit_status, printable
from torchlab.core.launch.arguments import build_parser, exit_code
from torchlab.core.launch.outbox_reporter import OutboxReporter
from torchlab.core.launch.stop import STOP_CLIENT
from torchlab.core.leave import exit_with
from torchlab.core.wire import events
from torchlab.core.wire import protocol as p
from torchlab.core.wire.control_server import ControlServer
from torchlab.core.wire.observer import TrainerObserver
from torchlab.core.wire.outbox import Outbox
from torchlab.core.wire.payloads import ModuleInfo, RankProcess, RunInfo
from torchlab.core.wire.run_status import RunStatus
from torchlab.core.wire.runtime import Endpoint, die_with_parent
from torchlab.core.wire.throttle import RefusedCommands, RefusedLines

if TYPE_CHECKING:  # imported in the methods that use them: the socket is served while torch and the workload load
    from torchlab.core.engine.ranks.supervisor import Supervisor
    from torchlab.core.launch.training_plan import TrainingPlan
    from torchlab.core.records.rundir import RunDirectory

#: The parent-death signal: its own signal, so that a detached trainer can ignore it while a plain
#: SIGTERM (someone's ``kill``) still stops it.
PARENT_DEATH_SIGNAL = signal.SIGUSR2
PARENT_POLL_S = 0.5
REGISTRY_INTERVAL_S = 2.0
FIRST_CLIENT_GRACE_S = 10.0


class Worker:
    """Owns the trainer, the control server, and the rules for when to stop."""

    def __init__(self, run_dir: Path, endpoint: Endpoint, token: str, training_args: list[str]) -> None:
        self.run_dir = run_dir
        self.endpoint = endpoint
        self.training_args = training_args
        #: after a detach, the app going away does not stop the run (until another app attaches)
        self.detached = False
        self.attached = False
        self.outbox = Outbox()
        self.reporter = OutboxReporter(self.outbox, on_run_started=self._on_run_started, on_leaving=self.finish)
        self.trainer = None  # the run's Supervisor, once built: the Trainer's API, whatever the world size
        # The app's commands from its hello on (control_server.py): those that come before the Supervisor exists wait
        # here, in the order typed, and it takes them before the first step (``_take_commands``).
        self._commands_lock = threading.Lock()
        self._commands_to = None  # the Supervisor, from its creation
        self._typed_ahead: list[p.TrainerCommand] = []
        self._config = None
        self._welcome: p.Welcome | None = None
        self._ready = threading.Event()
        self._parent = os.getppid()
        self._started = time.time()
        # The registry thread and the main thread both write the entry: one at a time, and nothing
        # after the final one (a registry write begun before it landed after it: "running" forever).
        self._publish_lock = threading.Lock()
        self._final_published = False
        # Refused lines go to the run's journal, at most a burst a minute. Until the run directory is open
        # they wait in ``_unjournalled`` (the throttle bounds them); once it is closed they are dropped.
        self._refusals = RefusedLines("app socket")
        self._journal_lock = threading.Lock()
        self._journal: TrainerObserver | None = None
        self._journal_closed = False
        self._unjournalled: list[events.LineRefused] = []
        self.server = ControlServer(
            endpoint.socket_path, token, self.outbox,
            welcome=self._wait_for_welcome, on_command=self._on_command,
            on_client_gone=self._on_client_gone, on_client_attached=self._on_client_attached,
            on_refused=self._journal_refusal,
        )
        self.reporter.set_state(RunStatus.STARTING, 0)

    # ------------------------------------------------------------------ running
    def run(self) -> int:
        """Set the run up and train it to its end: the process's exit status (the module's docstring says which). A
        failure the trainer cannot report itself reaches the app from here (``_report_failure``)."""
        from torchlab.core.launch.training_plan import plan_training
        from torchlab.core.records.rundir import RunDirectory

        args = build_parser().parse_args(self.training_args)
        directory = RunDirectory(self.run_dir)
        self._open_journal(directory)
        journal = RefusedCommands(directory)  # the trainer's refusals of the app's commands: a burst a minute
        try:
            try:
                self.trainer = self._prepared_supervisor(plan_training(args), directory, journal)
            except TorchlabError as error:
                directory.record_error(str(error))
                self._report_failure(str(error), "")
                return exit_status(error)
            return self._train(directory)
        finally:
            journal.close(self.reporter.step)
            self._close_journal()
            directory.close()

    def _prepared_supervisor(self, plan: TrainingPlan, directory: RunDirectory, journal: RefusedCommands) -> Supervisor:
        """The run's Supervisor, prepared: a run that cannot start fails here, as TorchlabError. It takes the app's
        commands from its creation on, first those the app sent while torch and the workload loaded."""
        from torchlab.core.engine.adapters.loading import exits_as_failure
        from torchlab.core.engine.measure.tensorboard import tensorboard_observers
        from torchlab.core.engine.parallel.distributed import rank_from_environment
        from torchlab.core.engine.ranks.supervisor import Supervisor
        from torchlab.core.launch.training_plan import ConfigRecord

        self._config = plan.config
        config_record = ConfigRecord(directory, plan)
        config_record.write_for_new_run()
        impact = ImpactTracker(directory.path / "impact.json")
        self.reporter.impact = impact
        supervisor = Supervisor(
            plan.config,
            observers=[journal, config_record, impact, self.reporter, *tensorboard_observers(plan.config)],
            run_dir=directory.path,
            resume_from=plan.resume,
            explicit=plan.explicit,
            external=rank_from_environment(supervised=False),  # rank 0 under torchrun
            resume_note=plan.resume_note(),
        )
        self._take_commands(supervisor)
        with exits_as_failure("as the run was set up"):
            supervisor.prepare()  # seeds and loads the workload where it trains here (a bad one fails now)
        return supervisor

    def _train(self, directory: RunDirectory) -> int:
        """Train the prepared run to its end: the exit status of its outcome, or of the error that ended it without
        one (the workload's own sys.exit, a first step that could not run). Whatever happened, an app gets a Welcome."""
        from torchlab.core.engine.adapters.loading import exits_as_failure

        try:
            with exits_as_failure("while it trained"):
                outcome = self.trainer.run()  # the Welcome is ready once the trainer reports run_started
        except WorkloadExited as error:  # the trainer never saw it: the run's code ended it
            directory.record_error(str(error), step=self.reporter.step + 1)
            self._report_failure(str(error), "")
            return exit_status(error)
        except TorchlabError as error:  # the first step could not run (a workload error)
            self._report_failure(str(error), traceback.format_exc())
            return exit_status(error)
        finally:
            if not self._ready.is_set():  # ranks that failed before training: the app still gets an answer
                self._welcome = p.Welcome(run=self._run_info(None), modules=[], options={}, state=self.reporter.state, step=self.reporter.step)
                self._ready.set()
        return exit_code(outcome.status)

    def _report_failure(self, message: str, trace: str) -> None:
        """A failure the trainer did not report itself (it never started, or the workload's code ended it): to the
        app, which may not have connected yet (it gets a Welcome that says so)."""
        self.outbox.add_event(p.Error(message=message, traceback=trace, step=self.reporter.step))
        self.reporter.set_state(RunStatus.FAILED, self.reporter.step, message)
        if not self._ready.is_set():
            self._welcome = p.Welcome(run=self._run_info(None), modules=[], options={}, state=RunStatus.FAILED, step=0)
        self._ready.set()

    def _on_run_started(self, started: events.RunStarted) -> None:
        """The trainer (or rank 0) is up: describe the run to apps that connect from now on."""
        self._welcome = p.Welcome(
            run=self._run_info(started),
            modules=[ModuleInfo(name, count, list(tied)) for name, count, tied
                     in zip(started.modules, started.module_params, started.module_tied or [[]] * len(started.modules))],
            options=started.options,
            state=RunStatus.RUNNING,
            step=started.step,
        )
        self._ready.set()

    def _run_info(self, started: events.RunStarted | None) -> RunInfo:
        """The run as the trainer's RunStarted describes it (None: the trainer never started)."""
        config = self._config
        return RunInfo(
            workload=config.workload if config else "",
            run_dir=str(self.run_dir),
            device=started.device if started else "",
            steps=self.reporter.total_steps or (config.steps if config else 0),
            batch_size=started.batch_size if started else 0,
            pid=os.getpid(),
            started=self._started,
            checkpoint_blocks=started.checkpoint_blocks if started else [],
            world_size=started.world_size if started else 1,
            ranks=[RankProcess(rank["rank"], rank["host"], rank["pid"], rank["device"], rank.get("node", 0))
                   for rank in (started.ranks if started else None) or []],
        )

    # ------------------------------------------------------------------ control
    def _wait_for_welcome(self) -> p.Welcome | None:
        """The run described as it is now (an app attaching later sees the current state and options)."""
        self._ready.wait()
        self.publish()  # the run's entry says it trains as soon as an app can see it (attached came at the hello)
        welcome = self._welcome
        if welcome is None or self.trainer is None:
            return welcome
        options = getattr(self.trainer, "options", None)
        return replace(
            welcome, state=self.reporter.state, step=self.reporter.step,
            options=options.as_dict() if options is not None else welcome.options,
        )

    def _on_command(self, command: p.Message, client: str) -> None:
        match command:
            case p.DetachCommand():
                self._detach()
            case p.TrainerCommand():
                command = _from_the_client(command, client)
                if not self._submit(command):
                    self.outbox.add_event(p.Log(level=p.LogLevel.WARNING, text=f"{command.type}: the run ended before it trained; "
                                                                      f"nothing was applied"))
                elif isinstance(command, p.StopCommand):
                    self._tell_stop_requested(command.reason)
            case _:
                self._refuse(f"{command.type} is not a command")

    def _submit(self, command: p.TrainerCommand) -> bool:
        """Queue ``command`` for the trainer's next step boundary, or, while the trainer is being built (torch imports,
        the workload loads), for its first; False when the run ended before it could train (nothing will take it)."""
        with self._commands_lock:  # in the order they came: a command cannot pass those still waiting
            if self._commands_to is not None:
                self._commands_to.submit(command)
            elif self._ready.is_set():  # answered without a trainer: the run failed as it was set up
                return False
            else:
                self._typed_ahead.append(command)
        return True

    def _take_commands(self, supervisor) -> None:
        """From now on ``supervisor`` takes the app's commands, first those that came while it was being made."""
        with self._commands_lock:
            self._commands_to, waiting, self._typed_ahead = supervisor, self._typed_ahead, []
            for command in waiting:
                supervisor.submit(command)

    def _tell_stop_requested(self, reason: str) -> None:
        """Who asked the run to stop, in its journal and the event log: the run's end says only that it stopped."""
        requested = events.StopRequested(step=self.reporter.step, reason=reason)
        self.reporter.on_event(requested)
        with self._journal_lock:
            if self._journal is not None:
                self._write_to_journal(requested)

    def _refuse(self, reason: str) -> None:
        self.outbox.add_event(p.Refused(reason=reason))
        self._journal_refusal(reason, False)

    # ------------------------------------------------------------------ refused lines in the journal
    def _open_journal(self, directory: TrainerObserver) -> None:
        with self._journal_lock:
            self._journal, waiting, self._unjournalled = directory, self._unjournalled, []
            for record in waiting:
                self._write_to_journal(record)

    def _close_journal(self) -> None:
        with self._journal_lock:
            unrecorded = self._refusals.unrecorded(self.reporter.step)
            if unrecorded and self._journal is not None:
                self._write_to_journal(unrecorded)
            self._journal, self._journal_closed = None, True

    def _journal_refusal(self, reason: str, before_hello: bool) -> None:
        """A line refused on the app's socket, in ``events.jsonl`` (at most a burst a minute; the next record
        let through says how many were held back). Called on connection threads: it never raises."""
        record = self._refusals.record(self.reporter.step, reason, before_hello=before_hello)
        if record is None:
            return
        with self._journal_lock:
            if self._journal is not None:
                self._write_to_journal(record)
            elif not self._journal_closed:  # the run directory is not open yet
                self._unjournalled.append(record)

    def _write_to_journal(self, record: events.LineRefused | events.LinesRefusedUnrecorded | events.StopRequested) -> None:
        try:
            self._journal.on_event(record)
        except StorageError:
            # The run directory kept the failure, as for any write it failed (the telemetry sampler's): the next
            # metrics row raises it and the run stops, saying which file could not be written. This thread, a
            # connection's, goes on reading.
            pass

    def _detach(self) -> None:
        """From now on the app may leave: the run goes on, and another app may attach."""
        self.detached = True
        self.outbox.add_event(p.Detached(step=self.reporter.step))
        self.publish()

    def _on_client_attached(self) -> None:
        self.attached = True
        self.detached = False  # this app, too, stops the run if it goes away without detaching
        self.publish()

    def _on_client_gone(self) -> None:
        self.attached = False
        if self.detached:
            self.publish()
        else:
            self.stop("the app went away")

    def parent_gone(self) -> None:
        """The app that started this trainer ended (the parent-death signal or the getppid poll)."""
        if not self.detached:
            self.stop("the app's process ended")

    # ------------------------------------------------------------------ the runtime directory entry
    def info(self) -> dict[str, Any]:
        config = self._config
        return {
            "pid": os.getpid(),
            "run_dir": str(self.run_dir.resolve()),
            "workload": config.workload if config else (self.training_args[:1] or [""])[0],
            "started": self._started,
            "state": self.reporter.state,
            "step": self.reporter.step,
            "steps": self.reporter.total_steps or (config.steps if config else None),
            "attached": self.attached,
            "training_args": self.training_args,  # what a restart from the app needs
        }

    def publish(self, *, final: bool = False) -> None:
        """Rewrite this run's entry for ``attach`` (best effort: a full /tmp must not stop training)."""
        with self._publish_lock:
            if self._final_published:
                return
            self._final_published = final
            try:
                self.endpoint.write_info(self.info())
            except OSError:
                pass

    def keep_published(self) -> None:
        last = None
        while True:
            current = (self.reporter.state, self.reporter.step, self.attached)
            if current != last:
                self.publish()
                last = current
            time.sleep(REGISTRY_INTERVAL_S)

    def finish(self) -> None:
        """The run ended, or a hang it ended leaves the process now (``OutboxReporter.leaving``): the app gets what is
        left to send, and the run's entry says how it ended."""
        # A run that failed (or ended) before its app connected waits a little for the app, so the
        # app can show why instead of "the trainer exited with code 2".
        if not self.detached:
            self.server.wait_for_first_client(timeout_s=FIRST_CLIENT_GRACE_S)
        self.outbox.close()
        self.server.flush(timeout_s=2.0)  # the app should see the final state or the error
        self.server.close()
        self.publish(final=True)  # a detached run's entry stays, so attach can say how it ended
        if not self.attached:
            self.endpoint.remove(keep_info=self.detached)

    def stop(self, reason: str, signal_number: int = 0) -> None:
        """Stop at the next step boundary (final checkpoint), or at once if training never started; ``signal_number``:
        the signal that asked (core/engine/parallel/preemption.py)."""
        if self.trainer is None:  # still importing torch or loading: nothing to save, nothing to attach to later
            # No entry is written from here on, and one being written (its app's hello, its going, changed what it
            # says) is let finish first, or it would put the entry back after the removal. Never waits long: a
            # signal may have interrupted the lock's holder on this very thread.
            self._final_published = True
            self._publish_lock.acquire(timeout=1.0)
            self.endpoint.remove()
            os._exit(EXIT_OK)
        self.trainer.request_stop(reason, signal_number)

    def watch_parent(self) -> None:
        """Stop when the app's process is gone (kill -9 leaves no other trace), unless detached."""
        die_with_parent(PARENT_DEATH_SIGNAL)  # the fastest of the three signs
        while os.getppid() == self._parent:
            time.sleep(PARENT_POLL_S)
        self.parent_gone()


def _from_the_client(command: p.TrainerCommand, client: str) -> p.TrainerCommand:
    """The command as the trainer journals it: asked for by the app, whatever source the line claimed; a stop says
    who asked by the name the client gave in its hello (``torchlab-tui stop`` names itself), in these words only."""
    if isinstance(command, (p.SetCommand, p.ProfileCommand)):
        return replace(command, source="app")
    if isinstance(command, p.StopCommand):
        return replace(command, reason="stopped by `torchlab-tui stop`" if client == STOP_CLIENT else "stopped from the app")
    return command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torchlab.core.launch.worker", description=__doc__)
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--socket", type=Path, required=True)
    parser.add_argument("--token-file", type=Path, required=True)
    parser.add_argument("training_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    training_args = args.training_args[1:] if args.training_args[:1] == ["--"] else args.training_args
    if "WORLD_SIZE" in os.environ and os.environ.get("RANK", "0") != "0":
        return _quiet_rank(args.run_dir, training_args)  # under torchrun: rank 0 serves the app
    endpoint = Endpoint(args.socket, args.token_file)
    if not args.token_file.exists():  # started by hand (torchrun on a node): make the token, readable only by you
        endpoint.create_token()
    token = endpoint.read_token()
    worker = Worker(args.run_dir, endpoint, token, training_args)
    rank = int(os.environ["RANK"]) if "WORLD_SIZE" in os.environ else None  # rank 0 under torchrun
    for signum in preemption.STOP_SIGNALS:  # a scheduler's warning: under torchrun, any rank's stops every rank
        signal.signal(signum, lambda signum, _: worker.stop(preemption.stop_reason(signum, rank), signum))  # lock-free
    signal.signal(signal.SIGHUP, lambda *_: worker.stop("the trainer's terminal hung up"))
    signal.signal(PARENT_DEATH_SIGNAL, lambda *_: worker.parent_gone())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C belongs to the app, which decides what to do
    threading.Thread(target=worker.watch_parent, name="torchlab-parent-watch", daemon=True).start()
    threading.Thread(target=worker.keep_published, name="torchlab-registry", daemon=True).start()
    try:
        code = worker.run()
    finally:
        worker.finish()
    return code


def _quiet_rank(run_dir: Path, training_args: list[str]) -> int:
    from torchlab.core.engine.parallel.distributed import rank_from_environment
    from torchlab.core.engine.ranks.supervisor import run_quiet_rank

    from torchlab.core.launch.training_plan import plan_training

    args = build_parser().parse_args(training_args)
    try:
        plan = plan_training(args)
        outcome = run_quiet_rank(plan.config, rank_from_environment(supervised=False), run_dir=run_dir,
                                 resume=plan.resume, explicit=plan.explicit)
    except TorchlabError as error:
        print(f"torchlab worker, rank {printable(os.environ.get('RANK'))}: {printable(error, keep_lines=True)}", file=sys.stderr)
        return exit_status(error)
    return exit_code(outcome.status)


if __name__ == "__main__":
    exit_with(main())  # a rank under torchrun leaves without torch's teardown (core/leave.py)
