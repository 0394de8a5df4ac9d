"""The command line's words: its commands and flags (what ``--help`` says of them), how the flags become the
settings layers of a TrainConfig, and the exit code of a run's outcome. Shared by every launcher (the ``torchlab-tui`` command, the trainer process the
app starts, headless runs, ``--resume``) without importing any of them, and without torch.

The exit codes are core/wire/errors.py's (the app, which cannot import this module, exits with the same):
0 finished or stopped on request; 1 a run that failed (the workload raised or called sys.exit while training,
a run file could not be written); 2 a usage, config or workload error (message names the setting, file or
line); 3 stopped on a non-finite loss or gradient; 130 interrupted (Ctrl-C), after saving a checkpoint.
A flag's value is passed on as typed: the setting's Bounds (core/wire/config.py) parse and refuse it.
"""

from __future__ import annotations

import argparse
import os
from importlib import metadata
from pathlib import Path
from typing import Any

from torchlab.core.engine.loading import SAMPLES, check_spec
from torchlab.core.wire.config import OPTIMIZERS, SCHEDULES, TrainConfig, build_config, load_config_file
from torchlab.core.wire.errors import EXIT_FAILED, EXIT_NONFINITE, EXIT_OK
from torchlab.core.wire.options import LIVE_OPTIONS


def exit_code(status: str) -> int:
    """The exit status of a process whose run ended with ``status`` (a RunOutcome's)."""
    return {"nonfinite": EXIT_NONFINITE, "failed": EXIT_FAILED}.get(status, EXIT_OK)


# Flags that set a top-level setting of the same name (dest == setting).
_SETTING_FLAGS = (
    "steps", "batch_size", "seed", "device", "optimizer", "lr", "weight_decay", "schedule", "warmup_steps",
    "eval_every", "eval_batches", "checkpoint_every", "keep_checkpoints", "log_every",
    "probe_every", "act_stats_every", "memory_every", "trial_steps", "telemetry_interval", "profile_steps", "shared_run_dir",
    "tensorboard",
)


def installed_version() -> str:
    """The version of the installed distribution: pyproject.toml's, through the package metadata."""
    try:
        return metadata.version("torchlab-tui")
    except metadata.PackageNotFoundError:  # imported from a checkout that was never installed
        return "(not installed)"


#: The commands besides training, each with the line that ``torchlab-tui --help`` shows and that opens its own
#: ``--help`` (cli.py runs each; one place for what a user reads of them).
SUBCOMMANDS = {
    "attach": "list your runs, and open the workbench on a running one",
    "stop": "stop a running run: it writes its final checkpoint and exits",
    "serve": "the workbench on a running run in a browser, over a forwarded port",
    "compare": "runs side by side: curves, the settings that differ, option changes",
    "export": "a run's figures for other tools: TensorBoard event files, CSV",
}


def commands_help() -> str:
    """The commands, one line each, as git and pip list theirs."""
    width = max(map(len, SUBCOMMANDS))
    lines = [f"  {name.ljust(width)}  {line}" for name, line in SUBCOMMANDS.items()]
    return "commands:\n" + "\n".join(lines) + "\n\n`torchlab-tui COMMAND --help` tells more of one."


def command_description(name: str) -> str:
    """What ``torchlab-tui NAME --help`` says first: its line of ``torchlab-tui --help``, as a sentence."""
    line = SUBCOMMANDS[name]
    return f"{line[0].upper()}{line[1:]}."


def build_parser() -> argparse.ArgumentParser:
    description = "A terminal workbench for PyTorch training: change a run while it trains,\nand see the effect."
    epilog = ("Live options can also be scripted: --at 50:amp=bf16 --at 120:clip=1.0\n"
              "(repeatable). A run detached with d (or by a hang-up) trains on:\n"
              "`torchlab-tui attach [RUN]` lists runs and reconnects, `torchlab-tui stop RUN`\nstops one.")
    parser = argparse.ArgumentParser(
        prog="torchlab-tui",
        usage="%(prog)s [WORKLOAD] [OPTIONS]\n       %(prog)s COMMAND [ARGS]",
        description=f"{description}\n\n{commands_help()}",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,  # the commands' lines kept as they are
    )
    parser.add_argument(
        "workload", nargs="?", default=None,
        help=f"a built-in sample ({', '.join(SAMPLES)}; default tiny_gpt), path/to/file.py[:factory] (its workload() when no factory is named) or package.module:factory",
    )
    parser.add_argument("--headless", action="store_true", help="train with a progress bar instead of the app")
    parser.add_argument("--config", type=Path, metavar="FILE.toml", help="settings file (a run's config.toml works)")
    parser.add_argument("--run-dir", type=Path, metavar="DIR", help="this run's directory: a new one, or an empty folder of yours that no one else may write into "
                        "(default: runs/<time>-<workload>)")
    parser.add_argument("--runs-root", type=Path, default=Path("runs"), metavar="DIR", help="where new run directories go (default: runs)")
    parser.add_argument(
        "--shared-run-dir", action=argparse.BooleanOptionalAction, default=None,
        help="make a new run directory and its files follow your umask (0755 and 0644 under umask 022), for others "
        "to read; by default only you can (0700, files 0600, whatever the umask). An existing run directory keeps its "
        "mode, and what a resume adds follows it",
    )
    parser.add_argument("--tensorboard", type=lambda text: str(Path(text).expanduser().absolute()), metavar="DIR",
                        help="write TensorBoard event files to DIR while training (the tensorboard extra); kept by a resume")
    parser.add_argument("--resume", type=Path, metavar="PATH", help="a checkpoint file, or a run directory to continue from its last.pt")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks for errors")
    parser.add_argument("--version", action="version", version=f"%(prog)s {installed_version()}")

    training = parser.add_argument_group("training")
    training.add_argument("--steps", metavar="N", help="optimizer steps to train to (default 200)")
    training.add_argument("--batch-size", metavar="N", help="per-step micro-batch size (default: the workload's, else 32)")
    training.add_argument("--seed", metavar="N", help="random seed (default 0)")
    training.add_argument("--device", metavar="auto|cpu|cuda[:N]", help="where to train (default auto)")
    training.add_argument("--optimizer", choices=OPTIMIZERS, help="default adamw")
    training.add_argument("--lr", metavar="LR", help="peak learning rate (default 1e-3)")
    training.add_argument("--weight-decay", metavar="WD", help="AdamW/SGD weight decay on matrices (default 0.01)")
    training.add_argument("--schedule", choices=SCHEDULES, help="LR schedule (default cosine with warmup)")
    training.add_argument("--warmup-steps", metavar="N", help="cosine warmup (default 5%% of steps)")
    training.add_argument("--eval-every", metavar="N", help="validation every N steps, 0 = off (default 50)")
    training.add_argument("--eval-batches", metavar="N", help="validation batches per evaluation (default 20)")
    training.add_argument("--checkpoint-every", metavar="N|auto",
                          help="checkpoint every N steps, 0 = only at the end, auto = every 100th step once a minute "
                               "has passed and within 1%% of the time (default auto)")
    training.add_argument("--keep-checkpoints", metavar="N", help="step checkpoints kept besides last.pt (default 3)")

    live = parser.add_argument_group("live options (change while training: keys in the app, --at headless)")
    for option in LIVE_OPTIONS:
        if not option.setting:  # a setting's flag is among the settings' (--steps)
            option.add_flag(live)
    live.add_argument("--at", action="append", default=[], metavar="STEP:OPTION=VALUE", help="apply a live change for optimizer step STEP")
    live.add_argument("--trial", action="append", default=[], metavar="STEP:OPTION=VALUE",
                      help="before step STEP, try OPTION=VALUE for --trial-steps steps against as many as it is, on the "
                           "same batches from the same state, then train on as if untried (results in trials.jsonl)")
    live.add_argument("--trial-steps", metavar="K", help="the steps of each arm of a trial (default 20)")

    probes = parser.add_argument_group("probes")
    probes.add_argument("--log-every", metavar="N", help="report metrics every N steps (default 1)")
    probes.add_argument("--probe-every", metavar="N|auto", help="per-module grad norms every N steps, 0 = off, auto = within ~1%% of step time (default auto)")
    probes.add_argument("--act-stats-every", metavar="N", help="activation statistics every N steps, 0 = off (default 0)")
    probes.add_argument("--memory-every", metavar="N|auto",
                        help="memory by kind (saved activations, per module) every N steps, 0 = off, auto = at most once a second (default auto)")
    probes.add_argument("--profile-at", action="append", metavar="STEP", help="profile from optimizer step STEP (repeatable)")
    probes.add_argument("--profile-steps", metavar="N", help="steps a profiler snapshot records, after 1 warm-up (default 5)")
    probes.add_argument("--telemetry-interval", metavar="SECONDS", help="GPU/host sampling period, 0 = off (default 1)")
    return parser


def setting_layers(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """The settings of the ``--config`` file and of the flags, as ``build_config`` layers."""
    file_settings: dict[str, Any] = load_config_file(args.config, follow_link=True) if args.config else {}
    if isinstance(file_settings.get("workload"), str):
        file_settings["workload"] = workload_as_stored(file_settings["workload"])
    flags: dict[str, Any] = {name: getattr(args, name) for name in _SETTING_FLAGS if getattr(args, name) is not None}
    if args.workload is not None:
        flags["workload"] = workload_as_stored(args.workload)
    if args.profile_at:
        flags["profile_at"] = list(args.profile_at)
    flags["options"] = {o.name: getattr(args, o.name) for o in LIVE_OPTIONS if not o.setting and getattr(args, o.name) is not None}
    flags["at"] = list(args.at)
    flags["trials"] = list(args.trial)
    return file_settings, flags


def workload_as_stored(typed: str) -> str:
    """The workload as a run records it: a file as an absolute path (``/home/me/proj/my_model.py:workload``), so
    that ``--resume`` finds it from any directory; a sample or a module path as typed (Python looks a module up
    where the run is started, and a checkpoint's workload is compared with config.toml's as this string)."""
    spec = check_spec(typed)
    return f"{spec.file}:{spec.factory}" if spec.file is not None else spec.text


def workload_origin(args: argparse.Namespace) -> str | None:
    """Where the workload on the command line came from, for a comment in config.toml (``workload typed as
    my_model.py:workload in /home/me/proj``), where the run records it otherwise than typed; else None."""
    if args.workload is None or workload_as_stored(args.workload) == args.workload:
        return None
    return f"workload typed as {args.workload} in {os.getcwd()}"


def resolve_config(args: argparse.Namespace) -> tuple[TrainConfig, set[str]]:
    """The merged config, and the names of live options given explicitly (flags or file).

    With ``--resume``, this is what the flags alone say (checked here, without torch); the trainer's
    process starts from the checkpoint's configuration instead (core/launch/resume.py).
    """
    file_settings, flags = setting_layers(args)
    config = build_config(file_settings, flags)
    explicit = set(file_settings.get("options", {})) | set(flags["options"])
    return config, explicit
