"""The command line's words: its commands and flags (what ``--help`` says of them), how the flags become the
settings layers of a TrainConfig, and the exit code of a run's outcome. Shared by every launcher (the ``torchlab-tui`` command, the trainer process the
app starts, headless runs, ``--resume``) without importing any of them, and without torch.

The exit codes are core/errors.py's (the app, which cannot import this module, exits with the same):
0 finished or stopped on request; 1 a run that failed (the workload raised or called sys.exit while training,
a run file could not be written); 2 a usage, config or workload error (message names the setting, file or
line); 3 stopped on a non-finite loss or gradient; 130 interrupted (Ctrl-C), after saving a checkpoint.
A setting's flag is generated from its declaration (core/records/settings.py ``SETTINGS``), its default stated in its help
from the declared one; its value is passed on as typed, and the setting's check parses and refuses it.
"""

from __future__ import annotations

import argparse
import os
from importlib import metadata
from pathlib import Path
from typing import Any

from torchlab.core.engine.adapters.loading import SAMPLES, check_spec
from torchlab.core.errors import EXIT_FAILED, EXIT_NONFINITE, EXIT_OK, printable
from torchlab.core.records.config import DEFAULT_WORKLOAD, TrainConfig, build_config, load_config_file, suggestion
from torchlab.core.records.settings import SETTINGS, Group
from torchlab.core.options import LIVE_OPTIONS
from torchlab.core.wire.run_status import RunStatus


def exit_code(status: RunStatus) -> int:
    """The exit status of a process whose run ended with ``status`` (a RunOutcome's)."""
    return {RunStatus.NONFINITE: EXIT_NONFINITE, RunStatus.FAILED: EXIT_FAILED}.get(status, EXIT_OK)


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
    "plan": "will it fit: each setting's peak memory per rank, before launching",
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


class CommandParser(argparse.ArgumentParser):
    """The parser of ``torchlab-tui`` and of each of its commands: a refusal is one line, exit 2, as the settings'
    own refusals are (argparse put its usage first), and a mistyped flag is answered with the flag it is closest to:
    ``--stpes 5``, "unrecognized arguments: --stpes (did you mean '--steps'?)"."""

    def parse_args(self, args: Any = None, namespace: Any = None) -> argparse.Namespace:
        parsed, unknown = self.parse_known_args(args, namespace)
        if unknown:
            flags = [action_flag for action in self._actions for action_flag in action.option_strings]
            first_flag = next((word.split("=", 1)[0] for word in unknown if word.startswith("--")), None)
            hint = suggestion(first_flag, flags) if first_flag else ""
            self.error(f"unrecognized arguments: {' '.join(unknown)}{hint}")
        return parsed

    def error(self, message: str) -> None:  # type: ignore[override]  # argparse's says it never returns, and it does not
        self.exit(2, f"{self.prog}: error: {printable(message)}; `{self.prog} --help` lists what it takes.\n")


def command_parser(name: str) -> CommandParser:
    """The parser of ``torchlab-tui NAME``, its ``--help`` opening with the command's line."""
    return CommandParser(prog=f"torchlab-tui {name}", description=command_description(name))


def build_parser() -> argparse.ArgumentParser:
    """The command line: its own flags, and one per setting (core/records/settings.py ``SETTINGS``) and live option,
    under the headings of ``--help``."""
    description = "A terminal workbench for PyTorch training: change a run while it trains,\nand see the effect."
    epilog = ("Live options can also be scripted: --at 50:amp=bf16 --at 120:clip=1.0\n"
              "(repeatable). A run detached with d (or by a hang-up) trains on:\n"
              "`torchlab-tui attach [RUN]` lists runs and reconnects, `torchlab-tui stop RUN`\nstops one.")
    parser = CommandParser(
        prog="torchlab-tui",
        usage="%(prog)s [WORKLOAD] [OPTIONS]\n       %(prog)s COMMAND [ARGS]",
        description=f"{description}\n\n{commands_help()}",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,  # the commands' lines kept as they are
    )
    parser.add_argument(
        "workload", nargs="?", default=None,
        help=f"a built-in sample ({', '.join(SAMPLES)}; default {DEFAULT_WORKLOAD}), path/to/file.py[:factory] (its workload() when no factory is named) or package.module:factory; the factory returns a Workload, a LightningModule or a transformers Trainer",
    )
    parser.add_argument("--headless", action="store_true", help="train with a progress bar instead of the app")
    parser.add_argument("--config", type=Path, metavar="FILE.toml", help="settings file (a run's config.toml works)")
    parser.add_argument("--run-dir", type=Path, metavar="DIR", help="this run's directory: a new one, or an empty folder of yours that no one else may write into "
                        "(default: runs/<time>-<workload>)")
    parser.add_argument("--runs-root", type=Path, default=Path("runs"), metavar="DIR", help="where new run directories go (default: runs)")
    _add_setting_flags(parser, "run")
    parser.add_argument("--resume", type=Path, metavar="PATH", help="a checkpoint file, or a run directory to continue from its last.pt")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks for errors")
    parser.add_argument("--version", action="version", version=f"%(prog)s {installed_version()}")
    _add_setting_flags(parser.add_argument_group("training"), "training")

    live = parser.add_argument_group("live options (change while training: keys in the app, --at headless)")
    for option in LIVE_OPTIONS:
        if not option.setting:  # a setting's flag is among the settings' (--steps)
            option.add_flag(live)
    live.add_argument("--at", action="append", default=[], metavar="STEP:OPTION=VALUE", help="apply a live change for optimizer step STEP")
    live.add_argument("--trial", action="append", default=[], metavar="STEP:OPTION=VALUE",
                      help="before step STEP, try OPTION=VALUE for --trial-steps steps against as many as it is, on the "
                           "same batches from the same state, then train on as if untried (results in trials.jsonl)")
    _add_setting_flags(live, "live")
    _add_setting_flags(parser.add_argument_group("probes"), "probes")
    return parser


def _add_setting_flags(group: argparse._ActionsContainer, heading: Group) -> None:
    for setting in SETTINGS:
        if setting.group == heading:
            setting.add_flag(group)


def setting_layers(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """The settings of the ``--config`` file and of the flags, as ``build_config`` layers."""
    file_settings: dict[str, Any] = load_config_file(args.config, follow_link=True) if args.config else {}
    if isinstance(file_settings.get("workload"), str):
        file_settings["workload"] = workload_as_stored(file_settings["workload"])
    flags: dict[str, Any] = {s.name: getattr(args, s.name) for s in SETTINGS if getattr(args, s.name) is not None}
    if args.workload is not None:
        flags["workload"] = workload_as_stored(args.workload)
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
    """The merged config, and the names of the settings and live options given explicitly (``explicit_names``).

    With ``--resume``, this is what the flags alone say (checked here, without torch); the trainer's
    process starts from the checkpoint's configuration instead (core/launch/training_plan.py).
    """
    file_settings, flags = setting_layers(args)
    config = build_config(file_settings, flags)
    return config, explicit_names(file_settings, flags)


def explicit_names(file_settings: dict[str, Any], flags: dict[str, Any]) -> set[str]:
    """The settings and live options the user gave, in the ``--config`` file or as a flag: a resume keeps the
    checkpoint's values of the others, and a new run takes a workload's own starting values for them
    (``Workload.settings``, a transformers Trainer's TrainingArguments)."""
    layers = (file_settings, flags)
    return ({name for layer in layers for name in layer if name not in ("options", "at", "trials", "workload")}
            | {name for layer in layers for name in layer.get("options", {})})
