"""Turning a workload spec from the command line into a ``Workload``.

A spec is a built-in sample name (``tiny_gpt``), ``path/to/file.py:factory`` or
``package.module:factory`` (the ``uvicorn app:app`` convention); a file alone, ``path/to/file.py``, calls its
``workload`` (as uvicorn and torchrun take a file). A file without one is refused before it runs: its top-level
functions that take no arguments are listed from its source (``ast``), not by importing it. Every way this can go wrong becomes a
``WorkloadError`` that names the file and line at fault. ``check_spec`` and ``workload_label`` import
nothing, so the app can validate a spec without torch; ``load_workload`` runs the user's code, so only a spec
the user gave is loaded (core/launch/training_plan.py says when a checkpoint's is). ``spec_as_shown`` and
``spec_as_typed`` repeat a spec someone else chose in a message, bounded.

The user's code may call ``sys.exit``: ``exits_as_failure`` turns its SystemExit into a ``WorkloadExited`` naming
the line (a failed run, exit 1), wherever torchlab runs that code (its import, its factory, its training).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import os
import shlex
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any

from torchlab.core.errors import TorchlabError, WorkloadError, WorkloadExited, shown
from torchlab.core.safe_open import refuse_a_path_too_long

SAMPLES = {
    "mlp": "torchlab.sample_models.mlp:workload",
    "convnet": "torchlab.sample_models.convnet:workload",
    "tiny_gpt": "torchlab.sample_models.tiny_gpt:workload",
}
#: The longest spec from someone else that a message repeats whole (a path in a deep folder fits).
_SPEC_SHOWN_CHARS = 256
_FORM = ("a built-in sample (" + ", ".join(SAMPLES) + "), path/to/file.py[:factory] (default: workload) "
         "or package.module:factory")
#: The factory a file given alone is asked for.
DEFAULT_FACTORY = "workload"

#: A file with no such factory: this many of the functions it defines are named (a model file may define dozens).
LISTED_FUNCTIONS = 12


@dataclass(frozen=True)
class WorkloadSpec:
    """A parsed spec: either a file path or a module name, and the factory's name."""

    text: str
    factory: str
    file: Path | None = None
    module: str | None = None


def check_spec(text: str) -> WorkloadSpec:
    """Parse a spec and check what can be checked without running it (the file exists)."""
    text = text.strip()
    if text in SAMPLES:
        module, factory = SAMPLES[text].split(":")
        return WorkloadSpec(text=text, factory=factory, module=module)
    target, colon, factory = text.rpartition(":")
    if not colon and text.endswith(".py"):
        return _file_spec(text, text, DEFAULT_FACTORY, implied=True)
    if not colon or not target or not factory.isidentifier():
        raise WorkloadError(f"workload {shown(text)} is not {_FORM}.")
    if target.endswith(".py") or os.sep in target or "/" in target:
        return _file_spec(text, target, factory, implied=False)
    if not all(part.isidentifier() for part in target.split(".")):
        raise WorkloadError(f"workload {shown(text)}: {shown(target)} is not a module name or a .py file; it must be {_FORM}.")
    return WorkloadSpec(text=text, factory=factory, module=target)


def _file_spec(text: str, target: str, factory: str, *, implied: bool) -> WorkloadSpec:
    path = Path(target).expanduser()
    refuse_a_path_too_long("workload file", path)  # the one rule for a path's length (core/safe_open.py)
    if not path.is_file():
        raise WorkloadError(f"workload file {target} does not exist (looked for {path.resolve()}).")
    if implied:
        _refuse_a_file_without_the_default_factory(path, target)
    return WorkloadSpec(text=text, factory=factory, file=path.resolve())


def _refuse_a_file_without_the_default_factory(path: Path, target: str) -> None:
    """A file given alone must define ``workload``; if its source plainly does not, say which of its functions
    could be named instead, from the source: listing them runs none of the user's code. A file that cannot be
    parsed is let through, for its import to report the line at fault."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError, OSError):
        return
    names = _top_level_names(tree.body)
    if DEFAULT_FACTORY in names or "*" in names:  # a star import may bring it
        return
    candidates = [f"{target}:{node.name}" for node in tree.body
                  if isinstance(node, ast.FunctionDef) and not node.name.startswith("_") and _takes_no_arguments(node)]
    listed = (f"one of the functions it defines that take no arguments: {', '.join(candidates)}" if candidates
              else "it defines no function that takes no arguments: add def workload() returning a Workload")
    raise WorkloadError(f"workload file {target} defines no {DEFAULT_FACTORY}() for torchlab to call; name the factory "
                        f"to call after a colon, {listed}.")


def _top_level_names(body: list[ast.stmt]) -> set[str]:
    """The names a module's body binds at its top level (in ``if``/``try``/``with`` blocks too, not in functions)."""
    names: set[str] = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(name.id for target in targets for name in ast.walk(target) if isinstance(name, ast.Name))
        blocks = [getattr(node, field) for field in ("body", "orelse", "finalbody") if isinstance(getattr(node, field, None), list)]
        for block in blocks + [handler.body for handler in getattr(node, "handlers", [])]:
            names |= _top_level_names(block)
    return names


def _takes_no_arguments(function: ast.FunctionDef) -> bool:
    arguments = function.args
    positional = arguments.posonlyargs + arguments.args
    return (len(arguments.defaults) == len(positional)
            and all(default is not None for default in arguments.kw_defaults))


def spec_as_shown(text: str) -> str:
    """A spec someone else chose (a checkpoint's), as a message repeats it: quoted, whole while it is short and
    printable (the user must see exactly what would be imported), else cut as ``shown`` cuts any value."""
    return repr(text) if _typeable(text) else shown(text)


def spec_as_typed(text: str) -> str | None:
    """A spec as the user would type it on a command line (quoted for a shell where it needs to be), or None for
    one no message should print whole: long, or holding control characters (a terminal's escape codes)."""
    return shlex.quote(text) if _typeable(text) else None


def _typeable(text: str) -> bool:
    return isinstance(text, str) and text.isprintable() and 0 < len(text) <= _SPEC_SHOWN_CHARS


def workload_label(text: str) -> str:
    """A short name for run directories: the sample name, or the file or module's last part."""
    text = text.strip()
    if text in SAMPLES:
        return text
    target, colon, factory = text.rpartition(":")
    if not colon:  # a file given alone: its workload()
        target, factory = text, DEFAULT_FACTORY
    stem = Path(target).stem if target.endswith(".py") else target.rsplit(".", 1)[-1]
    return stem if factory == DEFAULT_FACTORY else f"{stem}-{factory}"


def load_workload(text: str):
    """Import the spec's module, call its factory, and return the validated ``Workload``."""
    from torchlab.core.workload import Workload  # torch is imported here, not at module import

    spec = check_spec(text)
    with exits_as_failure("while its file was imported", spec.file):
        module = _import_file(spec.file) if spec.file is not None else _import_module(spec.module)
    where = str(spec.file) if spec.file is not None else spec.module
    factory = getattr(module, spec.factory, None)
    if factory is None:
        defined = sorted(
            name for name, value in vars(module).items()
            if inspect.isfunction(value) and value.__module__ == module.__name__ and not name.startswith("_")
        )
        shown_names = ", ".join(defined[:LISTED_FUNCTIONS]) or "none"
        more = f" and {len(defined) - LISTED_FUNCTIONS} more" if len(defined) > LISTED_FUNCTIONS else ""
        raise WorkloadError(f"{where} has no {spec.factory!r} to call; functions it defines: {shown_names}{more}.")
    if not callable(factory):
        raise WorkloadError(f"{where}: {spec.factory!r} is a {type(factory).__name__}, not a function to call.")
    required = _required_parameters(factory)
    if required:
        raise WorkloadError(
            f"{describe_code(factory)}: the factory {spec.factory}() must take no arguments, "
            f"but requires {', '.join(required)}."
        )
    try:
        with exits_as_failure(f"in its factory {spec.factory}()", spec.file):
            workload = factory()
    except WorkloadExited:
        raise
    except TorchlabError as error:
        raise WorkloadError(f"{_frame_text(error.__traceback__, spec.file)}: {error}") from None
    except Exception as error:
        raise WorkloadError(
            f"{_frame_text(error.__traceback__, spec.file)}: the factory {spec.factory}() raised "
            f"{type(error).__name__}: {error}"
        ) from error
    if not isinstance(workload, Workload):
        adapted = _adapted(workload, factory, spec.file)
        if adapted is not None:
            return adapted
        raise WorkloadError(
            f"{describe_code(factory)}: {spec.factory}() returned {type(workload).__name__}, not a Workload; "
            f"return Workload(model=..., dataset=..., loss_fn=...) from torchlab.core.workload, a LightningModule or a "
            f"transformers Trainer."
        )
    return workload


def _adapted(made: Any, factory: Callable, file: Path | None) -> Any:
    """The Workload of what the factory returned where it is a LightningModule (core/engine/adapters/from_lightning.py) or a
    transformers Trainer (core/engine/adapters/from_transformers.py); their hooks (configure_optimizers, the data loaders) run
    here, and what they raise is said as the factory's would be."""
    from torchlab.core.engine.adapters.from_lightning import lightning_workload
    from torchlab.core.engine.adapters.from_transformers import transformers_workload

    for adapt, whose in ((lightning_workload, "LightningModule"), (transformers_workload, "Trainer")):
        try:
            with exits_as_failure(f"in its {whose}'s hooks", file):
                adapted = adapt(made, describe_code(factory))
        except TorchlabError:
            raise
        except Exception as error:
            hint = ""
            if "not attached to a `Trainer`" in str(error):
                hint = (" The workbench trains the module without Lightning's Trainer, so self.trainer is not there: "
                        "give what it reads (estimated_stepping_batches: the run's --steps) to the module itself.")
            raise WorkloadError(f"{_frame_text(error.__traceback__, file)}: the {whose}'s hook raised "
                                f"{type(error).__name__}: {str(error).rstrip('.')}.{hint}") from error
        if adapted is not None:
            return adapted
    return None


@contextmanager
def exits_as_failure(when: str, prefer_file: Path | None = None) -> Iterator[None]:
    """Runs the user's code (``when`` says which part, for the message): a SystemExit it raises (``sys.exit``,
    ``exit()``) becomes a WorkloadExited naming the file and line that raised it (in ``prefer_file`` where one
    of its frames is). A KeyboardInterrupt rises as it is: Ctrl-C interrupts a run, it does not fail it."""
    try:
        yield
    except SystemExit as exit:
        status = "" if exit.code is None else shown(exit.code)
        raise WorkloadExited(
            f"{_frame_text(exit.__traceback__, prefer_file)}: the workload called sys.exit({status}) {when}, which would end "
            f"torchlab with the status it names; a run whose code exits has failed (exit 1): raise an exception "
            f"instead, and its message is shown here."
        ) from None


def describe_code(function) -> str:
    """``file.py:LINE`` where a function is defined (or its repr when that cannot be known)."""
    try:
        code = inspect.unwrap(function).__code__
    except AttributeError:
        return repr(function)
    return f"{code.co_filename}:{code.co_firstlineno}"


def user_frame(tb: TracebackType | None, prefer_file: Path | None = None) -> traceback.FrameSummary | None:
    """The innermost frame in the user's code: not in torch, not in torchlab's engine (the innermost of all where
    none is)."""
    frames = traceback.extract_tb(tb)
    if prefer_file is not None:
        in_file = [f for f in frames if Path(f.filename) == prefer_file]
        if in_file:
            return in_file[-1]
    own = own_frame(tb)
    return own if own is not None else frames[-1] if frames else None


def own_frame(tb: TracebackType | None) -> traceback.FrameSummary | None:
    """The innermost frame of ``tb`` in the user's code, not in torch nor torchlab's engine; None where none is."""
    engine = str(Path(__file__).resolve().parents[1])  # core/engine/, every neighbourhood in it
    torch_dir = _package_dir("torch")
    for frame in reversed(traceback.extract_tb(tb)):
        name = frame.filename
        if name.startswith(engine) or (torch_dir and name.startswith(torch_dir)) or name.startswith("<"):
            continue
        return frame
    return None


def placed_error(error: BaseException) -> str:
    """``Type: message`` of an exception that ended a run, led by where the user's code raised it, where it did:
    ``data.py:23 in read_shard(): ValueError: corrupt shard 7`` and, indented below, that line of code. A long
    traceback is read from its top, the engine's frames, on a screen of 24 rows (issue 45)."""
    said = f"{type(error).__name__}: {error}"
    frame = own_frame(error.__traceback__)
    if frame is None:
        return said
    code = f"\n    {frame.line}" if frame.line else ""
    return f"{frame.filename}:{frame.lineno} in {frame.name}(): {said}{code}"


def _frame_text(tb: TracebackType | None, prefer_file: Path | None) -> str:
    frame = user_frame(tb, prefer_file)
    return f"{frame.filename}:{frame.lineno} in {frame.name}()" if frame else "workload"


def _import_file(path: Path) -> ModuleType:
    name = path.stem if path.stem.isidentifier() and path.stem not in sys.modules else f"torchlab_workload_{abs(hash(path))}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise WorkloadError(f"workload file {path} cannot be imported as Python.")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # dataclasses and pickling look modules up by name
    if str(path.parent) not in sys.path:  # let the file import its neighbours
        sys.path.insert(0, str(path.parent))
    try:
        module_spec.loader.exec_module(module)
    except SyntaxError as error:
        del sys.modules[name]
        raise WorkloadError(f"{error.filename}:{error.lineno}: syntax error: {error.msg}.") from None
    except Exception as error:
        del sys.modules[name]
        raise WorkloadError(
            f"{_frame_text(error.__traceback__, path)}: importing the workload file raised "
            f"{type(error).__name__}: {error}"
        ) from error
    return module


def _import_module(name: str) -> ModuleType:
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name and name.startswith(error.name):
            raise WorkloadError(
                f"cannot import workload module {name!r}: no module named {error.name!r} "
                f"(run from the directory that contains it, or install it)."
            ) from None
        raise WorkloadError(f"{_frame_text(error.__traceback__, None)}: importing {name} raised {error}") from error
    except SyntaxError as error:
        raise WorkloadError(f"{error.filename}:{error.lineno}: syntax error: {error.msg}.") from None
    except Exception as error:
        raise WorkloadError(
            f"{_frame_text(error.__traceback__, None)}: importing {name} raised {type(error).__name__}: {error}"
        ) from error


def _required_parameters(function) -> list[str]:
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return []
    return [
        name for name, parameter in signature.parameters.items()
        if parameter.default is inspect.Parameter.empty
        and parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
    ]


def _package_dir(name: str) -> str | None:
    module = sys.modules.get(name)
    file = getattr(module, "__file__", None)
    return str(Path(file).resolve().parent) if file else None
