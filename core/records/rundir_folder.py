"""The run directory as a folder: which one a run writes into (``choose_run_dir``), making it (``create_run_dir``), and
refusing one that someone else could have prepared or that holds something other than a run
(``refuse_an_unfit_run_dir``). What is written in it is core/records/rundir.py's. Apart from that, because a folder
is judged before there is anything to write: before a workload is loaded or a journal opened (core/launch/cli.py,
headless.py), and again where ``RunDirectory`` makes it.

A run directory torchlab makes is private: 0700, and everything created in it 0600 (folders 0700),
whatever the umask, as ssh-keygen writes a private key. ``shared_run_dir`` (``--shared-run-dir``) makes
it follow the umask instead (0755 and 0644 under the usual 022), less others' write permission on its
folders (under umask 002 the folders are 0755, the files 0664). What is made in a folder follows that
folder (core/records/storage.py), so a resume keeps the run's choice, and a ``chmod`` of the directory since:
torchlab never changes the mode of a directory or file that exists. What torch makes in it follows too: the
ranks' logs (``ranks/``, core/engine/ranks/supervisor.py), a profile's ``trace.json``, a ``--tensorboard`` folder
inside the run (the event files in it are TensorBoard's, as a failing rank's ``error.json`` is torch's:
made with the umask's mode, inside folders no one else may enter).

A directory torchlab did not make may have been prepared by someone else (``/tmp/run1``, world-writable,
``trials.jsonl`` linked to a file of yours). A run writes only into a folder it made with ``mkdir``, or
into one that belongs to you, that no one else may write into, and whose folders above (and links on the
way) are yours or root's and open to no one else, unless sticky (``/tmp``): the folder rule every command
follows (core/safe_open.py ``who_else_may_change``), here ``refuse_an_unfit_run_dir``, checked before
a workload is loaded or the directory opened, and again where it is opened (``create_run_dir``). A new
run's ``--run-dir`` must also hold nothing but an untrained run of yours (or nothing), and be private unless
``--shared-run-dir``: ``/``, a home folder, ``/tmp`` are refused. A ``--run-dir``
that is a link (yours: it is your argument) is followed once, and the folder it leads to is checked and
used. Every file of a run is opened without following a link, and only if regular (core/safe_open.py).
"""

from __future__ import annotations

import errno
import os
import re
import stat
import time
from pathlib import Path

from torchlab.core.errors import ConfigError, StorageError, shown
from torchlab.core.records.storage import make_folder, make_folders_above, reason, remedy, unreadable_run
from torchlab.core.safe_open import UnsafeFileError, kind_of, refuse_a_path_too_long, who_else_may_change

#: Where ``metrics.jsonl``'s rows that a resume replays go, so that the file holds each step once.
REPLACED_METRICS = "metrics.replaced.jsonl"


def new_run_path(root: Path, label: str) -> Path:
    """``root/<YYYYmmdd-HHMMSS>-<label>``, with a suffix if two runs start in the same second."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    safe_label = re.sub(r"[^A-Za-z0-9_.-]+", "_", label).strip("._") or "run"
    path = Path(root) / f"{stamp}-{safe_label}"
    suffix = 1
    while path.exists():
        suffix += 1
        path = Path(root) / f"{stamp}-{safe_label}-{suffix}"
    return path


def run_dir_of_checkpoint(resume: Path | None) -> Path | None:
    """The run directory a ``--resume`` path belongs to (a run directory, or a file in its checkpoints/), None
    for a checkpoint elsewhere; the OSError of a run that cannot be looked into (another user's private one)."""
    if resume is None:
        return None
    resume = Path(resume)
    for candidate in (resume, resume.parent.parent if _is(resume, stat.S_ISREG, follow=True) else resume.parent):
        if _is(candidate / "config.toml", stat.S_ISREG) and _is(candidate / "checkpoints", stat.S_ISDIR):
            return candidate
    return None


def create_run_dir(path: Path, *, shared: bool = False) -> Path:
    """Make the run directory and its ``checkpoints/``, or say in one sentence why it cannot be one: a path
    that is a file (``--run-dir /etc/passwd``), under something that is not a folder, not writable, or a
    folder someone else could have prepared (``require_folder_only_you_change``). The directory's path: ``path``, or
    where it leads if a link is on the way (the run goes on there, whatever the link is changed to).

    A new run directory is made with ``mkdir``, 0700 (``shared``: 0755 less the umask); the folders above
    it that are missing (the runs root) follow the umask, as ``mkdir -p`` makes them, less others' write
    permission. One that was there already (``--run-dir``, a resume, or one someone made between choosing
    the name and making it) must be yours and no one else's to write into; it keeps its mode.
    """
    path = Path(path)
    real = _without_links(path)
    label = f"run directory {_named(path, real)}"
    try:
        if os.path.exists(real) and not os.path.isdir(real):  # mkdir says "File exists": true, but not the fault
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(path))
        require_folder_only_you_change(path, label, _MAKE_ONE)  # nothing made in a folder someone else may change
        make_folders_above(real)
        try:
            os.mkdir(real, 0o755 if shared else 0o700)
        except FileExistsError:  # there already, or made by someone else since the name was chosen
            pass
        require_folder_only_you_change(path, label, _MAKE_ONE)  # after mkdir: whoever made it, it is judged
        make_folder(real / "checkpoints")
    except OSError as error:
        where = error.filename if error.filename and str(error.filename) != str(real / "checkpoints") else path
        message = f"run directory {path}: cannot be made ({where}: {error.strerror or error})"
        if error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EIO):
            raise StorageError(f"{message}: {remedy(error)}, then try again.") from None
        raise ConfigError(f"{message}; give --run-dir (or --runs-root) a folder you can write to.") from None
    return real


def choose_run_dir(run_dir: Path | None, resume: Path | None, runs_root: Path, label: str) -> Path:
    """``--run-dir`` if given; else the resumed run's own directory; else a new one under ``runs_root`` (a
    ConfigError if its name is too long: said here, where it is first used)."""
    chosen = run_dir or run_dir_of_checkpoint(resume)
    if chosen is not None:
        return chosen
    refuse_a_path_too_long("--runs-root", runs_root)
    return new_run_path(runs_root, label)


# ----------------------------------------------------------------------------- folders someone else may have made
#: The entries a run makes in its directory: a folder holding nothing else (or nothing) holds nothing but a run.
RUN_FILES = frozenset({"config.toml", "metrics.jsonl", REPLACED_METRICS, "events.jsonl", "system.jsonl",
                       "trials.jsonl", "impact.json", "trainer.log"})
RUN_FOLDERS = frozenset({"checkpoints", "profiles", "ranks"})
#: ``config.before-step-NNNNNNN.toml`` (a resume's), ``.NAME.tmp-PID`` (a write a kill cut short)
_MORE_RUN_FILES = re.compile(r"config\.before-step-\d+(-\d+)?\.toml|\..+\.tmp-\d+")

_MAKE_ONE = "Give another --run-dir, or make one with mkdir -m 700."


def refuse_an_unfit_run_dir(run_dir: Path | None, resume: Path | None, *, shared: bool = False) -> None:
    """Before the run directory is opened (and before a workload is loaded): the one this run would write into
    is yours and no one else's to write into; a new run's ``--run-dir`` holds nothing but an untrained run
    of yours, and is private unless ``shared``. One paragraph (ConfigError) saying how to go on, otherwise."""
    if run_dir is not None:
        refuse_a_path_too_long("--run-dir", run_dir)
    _refuse_a_run_dir_not_yours(run_dir, resume)
    _refuse_a_used_run_dir(run_dir, resume, shared=shared)


def _refuse_a_run_dir_not_yours(run_dir: Path | None, resume: Path | None) -> None:
    """The directory this run would write into, where it is there already (``--run-dir``, else the run
    directory of ``--resume``), is a folder of yours that no one else may write into, in folders no one else
    may swap it in (``require_folder_only_you_change``). A new directory under the runs
    root is checked where it is made (``create_run_dir``)."""
    if run_dir is not None:
        given, remedy = Path(run_dir), _MAKE_ONE
        real = _without_links(given)
        label = f"--run-dir {_named(given, real)}"
    else:
        try:
            given, remedy = run_dir_of_checkpoint(resume), "Give --run-dir DIR to continue it in a folder of yours."
        except OSError as error:  # another user's private run
            raise ConfigError(f"--resume {unreadable_run(resume, error)}") from None
        if given is None:
            return
        real, label = given, f"the run directory of --resume {resume}"
    try:
        if _is(real, stat.S_ISDIR, follow=True) or not os.path.lexists(real):  # anything else is refused where made
            require_folder_only_you_change(given, label, remedy)
    except OSError as error:
        raise _unusable(label, given, error) from None


def _refuse_a_used_run_dir(run_dir: Path | None, resume: Path | None, *, shared: bool) -> None:
    """A new run (no ``--resume``) goes into a ``--run-dir`` that holds nothing but an untrained run of yours
    (a directory made, never trained in) or nothing, and is private unless ``shared``.

    An earlier run's directory would get this run's rows appended to its journals (step 1 twice in
    ``metrics.jsonl``) and its checkpoints pruned; a home folder or ``/`` would get a run among its files; a
    folder others may enter would let them read the run without ``--shared-run-dir``. Each is refused,
    saying how to go on. Who owns it is ``_refuse_a_run_dir_not_yours``'s to check."""
    if run_dir is None or resume is not None:
        return
    run_dir = Path(run_dir)
    real = _without_links(run_dir)
    label = f"--run-dir {_named(run_dir, real)}"
    try:
        if not _is(real, stat.S_ISDIR, follow=True):
            return  # nothing there yet; or not a folder, which making it says
        _require_nothing_but_a_run(real, label)
        metrics = real / "metrics.jsonl"
        trained = (_is(metrics, stat.S_ISREG) and metrics.stat().st_size > 0) or _is(real / "checkpoints" / "last.pt", stat.S_ISREG)
        mode = stat.S_IMODE(os.stat(real).st_mode)
    except OSError as error:
        raise _unusable(label, run_dir, error) from None
    if trained:
        raise ConfigError(
            f"--run-dir {run_dir} already holds a run (its metrics and checkpoints): a new run there would mix "
            f"its rows with that run's and prune its checkpoints. Continue it with --resume {run_dir}, or give "
            f"another --run-dir."
        )
    if mode & 0o077 and not shared:
        raise ConfigError(
            f"{label} is open to other users (mode {mode:04o}), and a run is private unless --shared-run-dir: "
            f"chmod 700 {run_dir} first, or give --shared-run-dir to let them read it."
        )


def require_folder_only_you_change(folder: Path, label: str, remedy: str) -> None:
    """The folder rule (``who_else_may_change``, core/safe_open.py) for a run directory, said as a run's
    refusal: ConfigError. ``folder`` (as given: a link on the way is judged, then followed), where it is there,
    is a folder that belongs to you and that no one else may write into: only then is what is in it yours. In
    another user's folder, or one others may write into (``/tmp/run1`` made ``mkdir -m 777``), ``trials.jsonl``
    can be a link to a file of yours, or be swapped for one between two writes. Other users may read it where
    you chose so (``--shared-run-dir``). The folders above it are yours or root's, and only sticky ones
    (``/tmp``) open to others: whoever may rename entries in a folder above could move the run directory away
    mid-run and put a folder of theirs in its place."""
    real = _without_links(folder)
    if os.path.lexists(real):
        mode = os.lstat(real).st_mode
        if not stat.S_ISDIR(mode):
            raise UnsafeFileError(real, kind_of(mode), expected="a folder")
    fault = who_else_may_change(folder)
    if fault is None:
        return
    if fault.where != "itself":
        raise ConfigError(f"{label} {fault}: they could put a folder of theirs in its place. "
                          "Give a --run-dir (or --runs-root) in a folder of yours.")
    if fault.theirs:
        raise ConfigError(f"{label} {fault}, not to you: torchlab writes a run only into a folder of yours, which "
                          f"no one else can have prepared. {remedy}")
    raise ConfigError(f"{label} {fault}: they could swap its files for links to yours. {remedy}")


def _require_nothing_but_a_run(folder: Path, label: str) -> None:
    """Every entry of ``folder`` is one a run makes (a link or FIFO among them is refused where it is opened)."""
    foreign = sorted(name for name in os.listdir(folder)
                     if name not in RUN_FILES and name not in RUN_FOLDERS and not _MORE_RUN_FILES.fullmatch(name))
    if foreign:
        listed = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise ConfigError(f"{label} holds files that are not a run's ({listed}): a new run goes into an empty folder "
                          "or one that holds an unfinished run of yours. Give another --run-dir, or leave it out for a "
                          "new one under the runs root.")


def _is(path: Path, kind, *, follow: bool = False) -> bool:
    """Whether something of ``kind`` (``stat.S_ISDIR``...) is at ``path``, itself (``follow``: where a link
    leads); False where nothing is. Any other OSError (no permission, a name too long) propagates."""
    try:
        return kind((os.stat if follow else os.lstat)(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False


def _without_links(path: Path) -> Path:
    """``path``, or where it leads if a link is on its way: the folder checked is the folder used."""
    real = Path(os.path.realpath(path))
    return path if real == Path(os.path.abspath(path)) else real


def _named(given: Path, real: Path) -> str:
    return str(given) if given == real else f"{given} (a link to {real})"


def _unusable(label: str, run_dir: Path, error: OSError) -> ConfigError:
    """A run directory that cannot even be looked at, in one sentence: a name too long (only a ``--run-dir``
    can be: the others were found), no permission..."""
    if error.errno == errno.ENAMETOOLONG:
        return ConfigError(f"--run-dir {shown(str(run_dir))}: a name in it is longer than the 255 bytes a file name "
                           "may have: give a shorter --run-dir.")
    return ConfigError(f"{label}: cannot be used ({reason(error)}); give another --run-dir.")
