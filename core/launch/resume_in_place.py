"""A ``--resume`` of a run goes on in the run's own directory, or is refused saying why: it never trains in a new
folder unasked.

Where a resume trains is ``choose_run_dir``'s (core/records/rundir_folder.py): ``--run-dir`` if given; else the run
directory of the checkpoint (``RUN/checkpoints/`` beside a regular ``RUN/config.toml``); else a new folder under
the runs root, which is right for a checkpoint that is in no run (a file copied from elsewhere). A run whose
``config.toml`` was a FIFO, a link, a folder, missing or not TOML was no run directory by that rule: its resume
trained in a new folder under ``./runs``, exit 0, without a word, and its rows and checkpoints went where the
user would not look for them (issue 46).

So a folder that holds what a run writes (``config.toml``, ``metrics.jsonl``, ``events.jsonl``, ... :
``RUN_FILES``), named by ``--resume`` itself, as its ``checkpoints/`` or as the folder of a checkpoint in its
``checkpoints/``, is a run. It is continued in place only where its ``config.toml`` is a regular file that
reads as a configuration and its ``checkpoints`` a folder; otherwise the resume is refused, before anything
loads, in one paragraph that says why and how to continue the checkpoint in a new folder (``--run-dir``).

Torch-free: the app's process can check this before its screen changes.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from torchlab.core.errors import ConfigError, printable
from torchlab.core.records.config import settings_from_toml
from torchlab.core.records.rundir_folder import RUN_FILES, run_dir_of_checkpoint
from torchlab.core.records.storage import reason
from torchlab.core.safe_open import UnsafeFileError, kind_of, read_regular_text

#: Why a run's file that is not a regular file is not read, by what it is instead.
_WHY_REGULAR_ONLY = {
    "a symbolic link": "torchlab opens no file of a run through a link, which whoever made it could point at a file of yours",
}
_WHY_REGULAR_ONLY_ELSE = "torchlab reads only regular files in a run (a FIFO or a device would block or never end)"


def require_resume_in_place(resume: Path | None, run_dir: Path | None) -> None:
    """ConfigError, one paragraph, where ``--resume resume`` names a run that cannot be continued in its own
    directory; nothing where it can, where ``--run-dir`` says where to train, or where ``resume`` is no run's
    (a checkpoint from elsewhere trains in a new folder, as docs/run-files.md says)."""
    if resume is None or run_dir is not None:
        return
    resume = Path(resume)
    run = run_named_by(resume)
    if run is None:
        return
    fault = why_not_continued(run)
    if fault is None and run_dir_of_checkpoint(resume) is None:  # a layout the rule above misses: never a new folder
        fault = "it is not laid out as a run directory (RUN/checkpoints/ beside RUN/config.toml)"
    if fault is None:
        return
    shown = printable(resume)
    raise ConfigError(
        f"--resume {shown}: the run in {printable(run)} cannot be continued in its own directory: {fault}. A resume "
        f"goes on where its run is, and does not move it elsewhere unasked. To continue from its checkpoint in a new "
        f"run directory, name one: torchlab-tui --resume {shown} --run-dir NEW_DIR"
    )


def run_named_by(resume: Path) -> Path | None:
    """The folder holding a run that ``resume`` names (the run directory, its ``checkpoints/``, or a checkpoint file
    in there), or None: ``resume`` is no run's, or cannot be looked into (which the checkpoint's reading says)."""
    try:
        mode = os.stat(resume).st_mode  # the user's own path: a link of theirs is followed
    except OSError:
        return None
    if stat.S_ISDIR(mode):
        candidates = [resume] + ([resume.parent] if resume.name == "checkpoints" else [])
    elif resume.parent.name == "checkpoints":
        candidates = [resume.parent.parent]
    else:
        candidates = []
    return next((folder for folder in candidates if _holds_a_run(folder)), None)


def why_not_continued(run: Path) -> str | None:
    """Why the run in ``run`` cannot be continued there, as a clause, or None where it can."""
    config = run / "config.toml"
    try:
        mode = os.lstat(config).st_mode
    except FileNotFoundError:
        return "it has no config.toml, the record of how the run was started, which a resume reads and keeps"
    except OSError as error:
        return f"its config.toml cannot be looked at ({reason(error)})"
    if not stat.S_ISREG(mode):
        kind = kind_of(mode)
        return f"its config.toml is {kind}, not a regular file: {_WHY_REGULAR_ONLY.get(kind, _WHY_REGULAR_ONLY_ELSE)}"
    try:
        settings_from_toml(read_regular_text(config), "its config.toml")
    except UnsafeFileError as error:  # swapped since the lstat
        return f"its config.toml is {error.kind}, not a regular file"
    except OSError as error:
        private = " (not readable by you)" if error.errno in (errno.EACCES, errno.EPERM) else ""
        return f"its config.toml cannot be read: {reason(error)}{private}"
    except ConfigError as error:
        return str(error).rstrip(".")
    checkpoints = run / "checkpoints"
    try:
        mode = os.lstat(checkpoints).st_mode
    except FileNotFoundError:
        return "it has no checkpoints folder"
    except OSError as error:
        return f"its checkpoints folder cannot be looked at ({reason(error)})"
    if not stat.S_ISDIR(mode):
        return f"its checkpoints is {kind_of(mode)}, not a folder"
    return None


def _holds_a_run(folder: Path) -> bool:
    """Whether ``folder`` holds any of the files a run writes (of any kind: a FIFO named config.toml counts)."""
    return any(os.path.lexists(folder / name) for name in RUN_FILES)
