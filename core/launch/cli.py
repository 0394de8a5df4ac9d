"""``torchlab-tui``: the command line. Parses flags (core/launch/arguments.py) into a TrainConfig and hands
it to a runner: the app (default; the trainer runs in a child process), a headless run (``--headless``),
or one of the commands ``torchlab-tui --help`` lists (arguments.py's ``SUBCOMMANDS``): ``attach``, ``stop``,
``serve``, ``compare``, ``export``, ``plan``.

This module imports no torch: the app's process must stay torch-free, and a usage error should be
reported in milliseconds.

Exit codes, the same for the app and a headless run (core/errors.py defines them):

    0    finished, stopped on request (q, Ctrl-C once in the app), or detached
    1    a run that failed: the workload raised or called sys.exit while training, a run file could not be
         written (a full disk); the message says what is intact
    2    bad input: a setting, flag or config file; a workload that cannot load or take its first step; a run
         directory, runtime directory or file refused. One paragraph, never a traceback
    3    stopped on a non-finite loss or gradient (and nothing else: a workload's own sys.exit(3) is a 1)
    130  interrupted (a second Ctrl-C of a headless run), the checkpoints so far kept
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import traceback
from pathlib import Path

from torchlab.core.errors import EXIT_INTERRUPTED, EXIT_OK, ConfigError, TorchlabError, exit_status, printable
from torchlab.core.launch.arguments import build_parser, resolve_config
from torchlab.core.records.config import TrainConfig, build_config, load_config_file
from torchlab.core.cpu_share import prefer_passive_openmp_waits
from torchlab.core.leave import exit_with


def main(argv: list[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["attach"]:
        from torchlab.core.launch.attach import main as attach

        return attach(arguments[1:])
    if arguments[:1] == ["stop"]:
        from torchlab.core.launch.stop import main as stop

        return stop(arguments[1:])
    if arguments[:1] == ["serve"]:
        from torchlab.core.launch.serve import main as serve

        return serve(arguments[1:])
    if arguments[:1] == ["compare"]:
        from torchlab.core.launch.compare import main as compare

        return compare(arguments[1:])
    if arguments[:1] == ["export"]:
        from torchlab.core.launch.export import main as export

        return export(arguments[1:])
    if arguments[:1] == ["plan"]:
        from torchlab.core.launch.plan import main as plan

        return plan(arguments[1:])
    args = build_parser().parse_args(argv)
    try:
        config, _ = resolve_config(args)  # the flags checked before anything starts, torch or not
        prefer_passive_openmp_waits()  # before torch loads: here (headless), in the app's trainer and in the ranks
        if not args.headless:
            return run_app(config, args, list(sys.argv[1:] if argv is None else argv))
        from torchlab.core.launch.headless import run_headless  # imports torch
        from torchlab.core.launch.training_plan import plan_training

        return run_headless(plan_training(args), run_dir=args.run_dir, runs_root=args.runs_root)
    except TorchlabError as error:
        if args.debug:
            traceback.print_exc()
        print(f"torchlab-tui: error: {printable(error, keep_lines=True)}", file=sys.stderr)  # names a path the user gave
        return exit_status(error)  # a full disk, a workload that exited: a failed run, no usage error
    except KeyboardInterrupt:  # a second Ctrl-C during a headless run: abort at once, as it said it would
        print("torchlab-tui: aborted; the checkpoints written so far are kept.", file=sys.stderr)
        return EXIT_INTERRUPTED


def run_app(config: TrainConfig, args: argparse.Namespace, argv: list[str]) -> int:
    """The workbench: the app in this process (no torch), the trainer in a child with the same flags."""
    gc.disable()  # until tune_garbage_collection(): the app's imports are all kept, nothing to collect
    try:
        from torchlab.core.engine.adapters.loading import check_spec, workload_label
        from torchlab.core.engine.measure.tensorboard import refuse_an_unfit_tensorboard_folder
        from torchlab.core.launch.terminal import require_terminal
        from torchlab.core.records.rundir_folder import choose_run_dir, create_run_dir, refuse_an_unfit_run_dir
        from torchlab.core.wire.runtime import runtime_dir
        from torchlab.tui.app import TorchlabApp, tune_garbage_collection
        from torchlab.tui.link import ProcessLink

        workload = config.workload if args.resume is None else resumed_workload(args)
        if workload:
            check_spec(workload)  # a missing file is said here, before the screen changes
        refuse_an_unfit_run_dir(args.run_dir, args.resume, shared=config.shared_run_dir)
        if config.tensorboard is not None:  # refused here, as headless does, not by the trainer after the screen changed
            refuse_an_unfit_tensorboard_folder(Path(config.tensorboard))
        runtime_dir()  # where the trainer's socket goes: a refusal is said here too, before a run directory exists
        require_terminal("torchlab-tui", "`--headless` trains with a progress bar instead, which a file can take.")
        run_dir = create_run_dir(choose_run_dir(args.run_dir, args.resume, args.runs_root, workload_label(workload) if workload else "resumed"),
                                 shared=config.shared_run_dir)
        links: list[ProcessLink] = []
        app = TorchlabApp(lambda: links.append(ProcessLink(run_dir, argv)) or links[-1], workload=workload)
    except BaseException:
        gc.enable()
        raise
    tune_garbage_collection()  # freezes what exists, then enables the collector
    app.run()
    if app.run_state.detached and links and links[-1].endpoint_name:
        name = links[-1].endpoint_name
        print(f"Detached: {printable(app.run_state.after_detach)}. `torchlab-tui attach {printable(name)}` reconnects.",
              file=sys.stderr)
    print(f"Run directory: {printable(run_dir.absolute())}", file=sys.stderr)  # absolute: the hint works from anywhere
    for line in app.how_it_ended(run_dir):
        print(printable(line, keep_lines=True), file=sys.stderr)
    return app.return_code or EXIT_OK


def resumed_workload(args: argparse.Namespace) -> str | None:
    """The workload a ``--resume`` continues, told without torch (the app's process): the one given, else
    the one in the run's ``config.toml``. The trainer's process reads the checkpoint itself (core/launch/training_plan.py)."""
    from torchlab.core.launch.resume_in_place import require_resume_in_place
    from torchlab.core.records.rundir_folder import run_dir_of_checkpoint
    from torchlab.core.safe_open import open_regular
    from torchlab.core.records.storage import unreadable_run

    try:
        if not args.resume.exists():
            raise ConfigError(f"--resume {args.resume}: no such checkpoint file or run directory.")
        if not args.resume.is_dir():  # a FIFO or a link is refused here, as the trainer would, before the screen changes
            os.close(open_regular(args.resume))
        require_resume_in_place(args.resume, args.run_dir)  # refused before the app makes a run directory
        if args.workload is not None:
            return args.workload
        run_dir = run_dir_of_checkpoint(args.resume)
        if run_dir is None:
            return None  # a checkpoint outside its run: the app shows the trainer's word once it has read it
        return build_config(load_config_file(run_dir / "config.toml")).workload
    except OSError as error:  # another user's private run (0700): as the trainer's process says it
        raise ConfigError(f"--resume {unreadable_run(args.resume, error)}") from None


def entry() -> None:
    """The ``torchlab-tui`` command: ``main``'s exit status (a rank under torchrun leaves without torch's teardown)."""
    exit_with(main())


if __name__ == "__main__":
    exit_with(main())  # a rank under torchrun leaves without torch's teardown (core/leave.py)
