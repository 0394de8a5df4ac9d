"""The command line: a headless run writes the run directory, and every bad input gets its message and exit code.

Most cases call ``main()`` in-process (torch is imported once); a few run the installed console
script to prove the real entry point, exit codes and output.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import re
import sys
import tomllib
from pathlib import Path

import pytest

from trainers import WORKLOADS
from torchlab.core.errors import EXIT_FAILED, EXIT_NONFINITE, EXIT_OK, EXIT_USAGE
from torchlab.core.launch.cli import main

TINY = WORKLOADS / "tiny.py"


def run_cli(tmp_path: Path, *args: str) -> int:
    return main([*args, "--headless", "--runs-root", str(tmp_path / "runs")])


def with_line_numbers(message: str, source: Path = TINY) -> str:
    """Replace ``{snippet}`` with the number of the line of ``source`` that contains the snippet."""
    lines = source.read_text().splitlines()
    return re.sub(r"\{([^}]+)\}", lambda m: str(next(i for i, line in enumerate(lines, 1) if m.group(1) in line)), message)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def only_run_dir(tmp_path: Path) -> Path:
    [run_dir] = (tmp_path / "runs").iterdir()
    return run_dir


def test_headless_run_writes_the_run_directory(tmp_path):
    code = run_cli(tmp_path, f"{TINY}:workload", "--steps", "12", "--checkpoint-every", "5",
                   "--eval-every", "6", "--at", "4:clip=0.5", "--at", "8:amp=bf16")
    assert code == EXIT_OK
    run_dir = only_run_dir(tmp_path)
    assert run_dir.name.endswith("-tiny")
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, 13))
    assert metrics[3]["clip"] == 0.5 and metrics[7]["amp"] == "bf16" and metrics[6]["amp"] == "off"
    events = read_jsonl(run_dir / "events.jsonl")
    assert all({"event", "step", "time"} <= set(e) for e in events)
    applied = [(e["step"], e["option"], e["value"], e["previous"]) for e in events if e["event"] == "option_applied"]
    assert applied == [(4, "clip", 0.5, None), (8, "amp", "bf16", "off")]
    assert [e["step"] for e in events if e["event"] == "checkpoint"] == [5, 10, 12]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [
        "last.pt", "step-0000005.pt", "step-0000010.pt", "step-0000012.pt"]
    config = tomllib.loads((run_dir / "config.toml").read_text())
    assert config["steps"] == 12 and config["at"] == ["4:clip=0.5", "8:amp=bf16"] and config["options"]["clip"] == "off"


def test_config_toml_round_trips_through_config_flag(tmp_path):
    assert run_cli(tmp_path, f"{TINY}:workload", "--steps", "3", "--lr", "0.004", "--clip", "2") == EXIT_OK
    first = only_run_dir(tmp_path)
    again = tmp_path / "again"
    assert main(["--config", str(first / "config.toml"), "--headless", "--run-dir", str(again)]) == EXIT_OK
    assert (again / "config.toml").read_text() == (first / "config.toml").read_text()


def test_resume_continues_in_the_same_run_directory(tmp_path):
    assert run_cli(tmp_path, f"{TINY}:workload", "--steps", "4", "--schedule", "constant") == EXIT_OK
    run_dir = only_run_dir(tmp_path)
    assert run_cli(tmp_path, f"{TINY}:workload", "--steps", "7", "--schedule", "constant", "--resume", str(run_dir)) == EXIT_OK
    assert [m["step"] for m in read_jsonl(run_dir / "metrics.jsonl")] == list(range(1, 8))


@pytest.mark.parametrize("args, message", [
    (["no_such_sample"], "is not a built-in sample (mlp, convnet, tiny_gpt)"),
    (["missing/file.py:workload"], "does not exist"),
    ([f"{WORKLOADS / 'syntax_error.py'}:workload"], "syntax_error.py:3: syntax error"),
    ([f"{WORKLOADS / 'import_error.py'}:workload"], "import_error.py:3 in <module>(): importing the workload file raised ModuleNotFoundError"),
    ([f"{TINY}:nope"], "has no 'nope' to call; functions it defines: bad_checkpoint_block_name"),
    ([f"{TINY}:factory_raises"], "tiny.py:{raise ValueError} in factory_raises(): the factory factory_raises() raised ValueError: dataset path /data/missing not found"),
    ([f"{TINY}:returns_list"], "returns_list() returned list, not a Workload"),
    ([f"{TINY}:needs_arguments"], "must take no arguments, but requires width"),
    ([f"{TINY}:bad_checkpoint_block_name"], "names 'body.9', which is not a submodule of TinyNet"),
    ([f"{TINY}:shape_mismatch"], "tiny.py:{return self.head(self.extra} in forward(): the first training step failed: RuntimeError"),
    ([f"{TINY}:not_scalar"], "tiny.py:{def loss_per_sample}: loss_fn must return a scalar floating-point tensor, got a tensor of shape [16, 1]"),
    (["tiny.module_that_is_not_there:workload"], "cannot import workload module 'tiny.module_that_is_not_there'"),
    ([f"{TINY}:workload", "--steps", "0"], "steps (--steps) must be a whole number of steps from 1 to 10^9; got '0'"),
    ([f"{TINY}:workload", "--steps", "99999999999999999999"], "steps (--steps) must be a whole number of steps from 1 to 10^9; got '99999999999999999999'"),
    ([f"{TINY}:workload", "--keep-checkpoints", "1e20"], "keep_checkpoints (--keep-checkpoints) must be a whole number from 1 to 1000; got '1e20'"),
    ([f"{TINY}:workload", "--keep-checkpoints", "100000000000000000000"], "keep_checkpoints (--keep-checkpoints) must be a whole number from 1 to 1000"),
    ([f"{TINY}:workload", "--warmup-steps", "1000000000000"], "warmup_steps (--warmup-steps) must be a whole number of steps from 0 to 10^9; got '1000000000000'"),
    ([f"{TINY}:workload", "--telemetry-interval", "1e-9"], "telemetry_interval (--telemetry-interval) must be 0 (off) or a number of seconds from 0.1 to 3600; got '1e-9'"),
    ([f"{TINY}:workload", "--eval-every", "99999999999999999999999"], "eval_every (--eval-every) must be a whole number of steps from 1 to 10^9, or 0 (off)"),
    ([f"{TINY}:workload", "--profile-at", "99999999999999999999"], "profile_at (--profile-at) must be optimizer steps from 1 to 10^9"),
    ([f"{TINY}:workload", "--at", "99999999999999999999:amp=bf16"], "STEP must be an optimizer step from 1 to 10^9"),
    ([f"{TINY}:workload", "--at", "1" * 5000 + ":amp=bf16"], "STEP must be an optimizer step from 1 to 10^9"),
    ([f"{TINY}:workload", "--lr", "-1"], "lr (--lr) must be a positive number; got '-1'"),
    ([f"{TINY}:workload", "--device", "tpu"], "device (--device) must be auto, cpu, cuda or cuda:N with N from 0 to 127; got 'tpu'"),
    ([f"{TINY}:workload", "--clip", "-3"], "options.clip (--clip): clip must be a positive max grad norm"),
    ([f"{TINY}:workload", "--at", "five:amp=bf16"], "is not of the form STEP:OPTION=VALUE"),
    ([f"{TINY}:workload", "--at", "5:amp=fp32"], "amp must be one of off, bf16, fp16"),
    ([f"{TINY}:workload", "--at", "5:turbo=on"], "unknown option 'turbo'"),
    ([f"{TINY}:workload", "--amp", "fp16"], "fp16 needs CUDA"),
    ([f"{TINY}:workload", "--probe-every", "often"], "probe_every (--probe-every) must be a whole number of steps from 1 to 10^9, 0 (off) or auto"),
    ([f"{TINY}:workload", "--checkpoint-every", "hourly"], "checkpoint_every (--checkpoint-every) must be a whole number of steps from 1 to 10^9, 0 (only at the end) or auto"),
    ([f"{TINY}:workload", "--resume", "/nonexistent/last.pt"], "--resume /nonexistent/last.pt: no such checkpoint file"),
    ([f"{TINY}:workload", "--batch-size", "1000"], "the dataset has 256 samples, fewer than one batch of 1000"),
    ([f"{TINY}:workload", "--seed", "4294967296"], "seed (--seed) must be a whole number from 0 to 4294967295"),
    ([f"{TINY}:workload", "--device", "cuda:99999999999999999999"], "device (--device) must be auto, cpu, cuda or cuda:N with N from 0 to 127"),
    ([f"{TINY}:workload", "--device", "cuda:200"], "with N from 0 to 127; got 'cuda:200'"),
    ([f"{TINY}:workload", "--run-dir", "/etc/passwd"], "run directory /etc/passwd: cannot be made (/etc/passwd: Not a directory)"),
    ([f"{TINY}:workload", "--run-dir", "/proc/1/nope"], "run directory /proc/1/nope: cannot be made"),
    ([f"{TINY}:workload", "--telemetry-interval", "1e30"], "telemetry_interval (--telemetry-interval) must be 0 (off) or a number of seconds from 0.1 to 3600; got '1e30'"),
    ([f"{TINY}:workload", "--workers", "1000"], "workers (--workers): workers must be a whole number from 0 (load in the training process) to"),
    ([f"{TINY}:workload", "--at", "5:amp=" + "x" * 5000], "amp must be one of off, bf16, fp16, got 'xxxxxxxx"),
])
def test_bad_input_exits_2_with_a_message_naming_the_fault(tmp_path, capsys, args, message):
    assert run_cli(tmp_path, *args, "--steps" if "--steps" not in args else "--seed", "3") == EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert err.startswith("torchlab-tui: error: ") and err.count("\n") == 0  # one paragraph
    assert with_line_numbers(message) in err
    assert "Traceback" not in err and len(err) < 600  # names a value given, never repeats all of it


def test_unknown_config_file_key_is_named_with_a_suggestion(tmp_path, capsys):
    config = tmp_path / "bad.toml"
    config.write_text('steps = 3\nbatch_sise = 8\n[options]\namp = "off"\n')
    assert main(["--config", str(config), "--headless"]) == EXIT_USAGE
    assert f"{config}: unknown setting 'batch_sise' (did you mean 'batch_size'?)" in capsys.readouterr().err
    config.write_text("steps = [")
    assert main(["--config", str(config), "--headless"]) == EXIT_USAGE
    assert "not valid TOML" in capsys.readouterr().err
    config.write_text('steps = "many"')
    assert main(["--config", str(config), "--headless"]) == EXIT_USAGE
    assert "steps (--steps) must be a whole number of steps from 1 to 10^9; got 'many'" in capsys.readouterr().err


def test_workload_error_on_the_first_step_is_also_in_events(tmp_path):
    assert run_cli(tmp_path, f"{TINY}:shape_mismatch", "--steps", "3") == EXIT_USAGE
    [error] = [e for e in read_jsonl(only_run_dir(tmp_path) / "events.jsonl") if e["event"] == "error"]
    assert "the first training step failed" in error["message"] and "Traceback" in error["traceback"]


def test_nonfinite_stop_exits_3_and_reports_the_module(tmp_path):
    assert run_cli(tmp_path, f"{TINY}:nan_in_forward", "--steps", "10") == EXIT_NONFINITE
    [report] = [e for e in read_jsonl(only_run_dir(tmp_path) / "events.jsonl") if e["event"] == "nonfinite"]
    assert report["module"] == "extra" and report["phase"] == "forward" and report["step"] == 6


def test_exception_mid_run_exits_1_with_traceback_and_keeps_a_checkpoint(tmp_path):
    assert run_cli(tmp_path, f"{TINY}:raises_at_step_4", "--steps", "10") == EXIT_FAILED
    run_dir = only_run_dir(tmp_path)
    events = read_jsonl(run_dir / "events.jsonl")
    [error] = [e for e in events if e["event"] == "error"]
    assert error["step"] == 4 and "simulated failure inside the model" in error["message"]
    assert "tiny.py" in error["traceback"]
    assert [e["step"] for e in events if e["event"] == "checkpoint"] == [3]
    assert (run_dir / "checkpoints" / "last.pt").exists()


def test_console_script_end_to_end(tmp_path):
    # Beside the interpreter in a venv; on PATH where the package went elsewhere (gpu_pass.sh's pip --target).
    script = shutil.which("torchlab-tui", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    assert script is not None, "no torchlab-tui console script beside the interpreter or on PATH"
    done = subprocess.run(
        [str(script), f"{TINY}:workload", "--headless", "--steps", "5", "--run-dir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "Finished at step 5" in done.stderr and "loss" in done.stderr
    bad = subprocess.run([str(script), "nope.py:workload", "--headless"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "does not exist" in bad.stderr and "Traceback" not in bad.stderr
    usage = subprocess.run([str(script), "--steps", "x"], capture_output=True, text=True, timeout=60)
    assert usage.returncode == 2 and usage.stderr == "torchlab-tui: error: steps (--steps) must be a whole number of steps from 1 to 10^9; got 'x'.\n"
    typo = subprocess.run([str(script), "--stpes", "5"], capture_output=True, text=True, timeout=60)
    assert typo.returncode == 2 and typo.stderr == ("torchlab-tui: error: unrecognized arguments: --stpes (did you mean "
                                                    "'--steps'?); `torchlab-tui --help` lists what it takes.\n")


def test_the_cli_module_does_not_import_torch():
    """The app's process runs the CLI; torch must load only in the trainer (or a headless run)."""
    code = "import sys, torchlab.core.launch.cli, torchlab.core.records.config, torchlab.core.engine.adapters.loading; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_the_app_path_turns_the_garbage_collector_back_on(tmp_path, capsys):
    """The app's start keeps the collector off while it imports; whatever happens next, it comes back on."""
    assert main(["missing.py:workload", "--runs-root", str(tmp_path)]) == EXIT_USAGE  # refused before the screen
    assert "does not exist" in capsys.readouterr().err
    assert gc.isenabled()
    code = (
        "import gc; gc.disable()\n"
        "from torchlab.tui.app import GC_THRESHOLDS, tune_garbage_collection\n"
        "tune_garbage_collection()\n"
        "assert gc.isenabled() and gc.get_threshold() == GC_THRESHOLDS and gc.get_freeze_count() > 10_000\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_version_comes_from_the_package_metadata(capsys):
    from importlib import metadata

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"torchlab-tui {metadata.version('torchlab-tui')}"


@pytest.mark.parametrize("toml_text", [
    "x = " + "[" * 100_000 + "]" * 100_000,
    "x = " + "{a = " * 20_000 + "1" + "}" * 20_000,
], ids=["nested-arrays", "nested-inline-tables"])
def test_a_config_file_nested_too_deeply_is_one_paragraph(tmp_path, capsys, toml_text):
    config = tmp_path / "deep.toml"
    config.write_text(toml_text)
    assert run_cli(tmp_path, f"{TINY}:workload", "--config", str(config)) == EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert err == f"torchlab-tui: error: --config {config}: not valid TOML here: its arrays or tables are nested too deeply to read."


def test_a_runtime_directory_that_is_not_safe_is_one_paragraph_for_attach_and_for_ranks(tmp_path, capsys, monkeypatch):
    from torchlab.core.launch.attach import main as attach

    unsafe = tmp_path / "xdg" / "torchlab"
    unsafe.mkdir(parents=True, mode=0o755)
    unsafe.chmod(0o755)  # another user could enter it
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg"))
    assert attach([]) == EXIT_USAGE
    assert capsys.readouterr().err.strip() == f"torchlab-tui attach: {unsafe} has mode 755, not 700: run chmod 700 {unsafe}."
    # Two ranks need the runtime directory for the channel between the supervisor and rank 0.
    assert run_cli(tmp_path, f"{TINY}:without_dropout", "--steps", "2", "--world-size", "2") == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"torchlab-tui: error: {unsafe} has mode 755, not 700" in err and "Traceback" not in err


def test_a_new_run_into_the_run_dir_of_an_earlier_one_is_refused_and_that_run_is_kept(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert run_cli(tmp_path, f"{TINY}:workload", "--steps", "3", "--run-dir", str(run_dir)) == EXIT_OK
    rows = (run_dir / "metrics.jsonl").read_text()
    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    capsys.readouterr()

    assert run_cli(tmp_path, f"{TINY}:workload", "--steps", "5", "--run-dir", str(run_dir)) == EXIT_USAGE
    error = capsys.readouterr().err
    assert f"--run-dir {run_dir} already holds a run" in error and f"--resume {run_dir}" in error
    assert "Traceback" not in error
    assert (run_dir / "metrics.jsonl").read_text() == rows  # not a row added
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == checkpoints

    assert run_cli(tmp_path, "--resume", str(run_dir), "--steps", "5") == EXIT_OK  # what the message says works
    assert [row["step"] for row in read_jsonl(run_dir / "metrics.jsonl")] == [1, 2, 3, 4, 5]


MISBEHAVING = WORKLOADS / "misbehaving.py"


@pytest.mark.parametrize("factory, message", [
    ("len_minus_one", "Workload.dataset: Samples.__len__ (MISBEHAVING:{def __len__}) returned -1; it must return "
                      "the number of samples, a whole number ≥ 0."),
    ("len_raises", "Workload.dataset: Samples.__len__ (MISBEHAVING:{def __len__}) raised RuntimeError: the index file "
                   "is missing; it must return the number of samples, a whole number ≥ 0."),
    ("len_not_a_number", "Workload.dataset: Samples.__len__ (MISBEHAVING:{def __len__}) returned 2.5; it must return "
                         "the number of samples, a whole number ≥ 0."),
    ("val_len_minus_one", "Workload.val_dataset: Samples.__len__ (MISBEHAVING:{def __len__}) returned -1"),
])
def test_a_dataset_whose_len_is_no_number_of_samples_is_one_paragraph(tmp_path, capsys, factory, message):
    """``__len__`` returning -1 ended in len()'s ValueError, a traceback from deep inside the engine."""
    assert run_cli(tmp_path, f"{MISBEHAVING}:{factory}", "--steps", "3", "--eval-every", "1") == EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert err.startswith("torchlab-tui: error: ") and err.count("\n") == 0 and "Traceback" not in err
    assert with_line_numbers(message, MISBEHAVING).replace("MISBEHAVING", str(MISBEHAVING)) in err


@pytest.mark.parametrize("factory, message", [
    ("factory_exits", "misbehaving.py:{    sys.exit()} in factory_exits(): the workload called sys.exit() in its factory "
                      "factory_exits(), which would end torchlab with the status it names; a run whose code exits has "
                      "failed (exit 1): raise an exception instead, and its message is shown here."),
    ("factory_exits_3", "misbehaving.py:{sys.exit(3)} in factory_exits_3(): the workload called sys.exit(3) in its factory factory_exits_3()"),
    ("factory_raises_system_exit", "misbehaving.py:{raise SystemExit} in factory_raises_system_exit(): the workload "
                                   "called sys.exit() in its factory factory_raises_system_exit()"),
    ("factory_exits_in_a_helper", "misbehaving.py:{no GPU, giving up} in _give_up(): the workload called "
                                  "sys.exit('no GPU, giving up') in its factory factory_exits_in_a_helper()"),
])
def test_a_factory_that_calls_sys_exit_is_a_failed_run_naming_the_line(tmp_path, capsys, factory, message):
    """sys.exit() in a factory ended torchlab with exit 0 (a run that finished), sys.exit(3) with 3 (a non-finite
    loss), and nothing said."""
    assert run_cli(tmp_path, f"{MISBEHAVING}:{factory}", "--steps", "3") == EXIT_FAILED
    err = capsys.readouterr().err.strip()
    assert err.startswith("torchlab-tui: error: ") and err.count("\n") == 0 and "Traceback" not in err
    assert with_line_numbers(message, MISBEHAVING) in err


def test_a_loss_that_calls_sys_exit_mid_run_fails_the_run_naming_the_line(tmp_path, capsys):
    assert run_cli(tmp_path, f"{MISBEHAVING}:loss_exits_at_step_3", "--steps", "10") == EXIT_FAILED
    err = capsys.readouterr().err
    expected = "misbehaving.py:{# in the loss} in loss(): the workload called sys.exit(3) while it trained"
    assert with_line_numbers(expected, MISBEHAVING) in err and "Traceback" not in err
    [error] = [e for e in read_jsonl(only_run_dir(tmp_path) / "events.jsonl") if e["event"] == "error"]
    assert with_line_numbers(expected, MISBEHAVING) in error["message"]


def test_the_console_script_exits_1_when_the_workload_calls_sys_exit_3(tmp_path):
    """Through the real entry point: 3 is the non-finite stop's status, and a workload's own exit is no such stop."""
    done = subprocess.run([sys.executable, "-m", "torchlab.core.launch.cli", f"{MISBEHAVING}:factory_exits_3", "--headless",
                           "--run-dir", str(tmp_path / "run")], capture_output=True, text=True, timeout=120)
    assert done.returncode == EXIT_FAILED
    assert done.stderr.count("\n") == 1 and "called sys.exit(3)" in done.stderr and "Traceback" not in done.stderr


def test_the_app_is_not_started_where_the_runtime_directory_is_refused(tmp_path):
    """The app started, made a run directory and showed the refusal with a traceback panel; quitting it exited 0.
    The refusal is now said before the screen changes, as a headless run says it: one paragraph, exit 2."""
    unsafe = tmp_path / "xdg" / "torchlab"
    unsafe.mkdir(parents=True)
    unsafe.chmod(0o755)
    done = subprocess.run([sys.executable, "-m", "torchlab.core.launch.cli", "mlp", "--runs-root", str(tmp_path / "runs")],
                          env={**os.environ, "XDG_RUNTIME_DIR": str(tmp_path / "xdg")}, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == EXIT_USAGE
    assert done.stderr == f"torchlab-tui: error: {unsafe} has mode 755, not 700: run chmod 700 {unsafe}.\n"
    assert not (tmp_path / "runs").exists()


def test_the_app_is_not_drawn_into_a_file_and_spends_nothing(tmp_path, capsys):
    """`torchlab-tui > out.txt` drew the app's escape codes into the file. Now refused before a run directory is made."""
    assert main(["mlp", "--runs-root", str(tmp_path / "runs")]) == EXIT_USAGE  # pytest's captured output is no terminal
    said = capsys.readouterr()
    assert said.err.count("\n") == 1 and said.err.startswith("torchlab-tui: error: not opened: torchlab-tui draws full screen")
    assert "--headless" in said.err and not (tmp_path / "runs").exists()


def test_the_app_refuses_a_resume_of_a_fifo_before_the_screen_changes(tmp_path, capsys):
    """``torchlab-tui --resume FIFO`` opened the app and showed 'The run failed at step 0' with a restart that
    would start the run over; headless said it in one paragraph. Now both say it before anything starts."""
    fifo = tmp_path / "last.pt"
    os.mkfifo(fifo)
    assert main(["--resume", str(fifo), "--runs-root", str(tmp_path)]) == EXIT_USAGE
    assert "is a FIFO (named pipe), not a regular file" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == [fifo]  # no run directory was made


SUBCOMMANDS = ("attach", "stop", "serve", "compare", "export")


def console_script() -> str:
    """The installed ``torchlab-tui``: beside the interpreter in a venv, else on PATH (gpu_pass.sh's pip --target)."""
    script = shutil.which("torchlab-tui", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    assert script is not None, "no torchlab-tui console script beside the interpreter or on PATH"
    return script


def test_help_lists_every_subcommand_with_a_line_and_how_to_learn_more():
    shown = subprocess.run([console_script(), "--help"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    for command in SUBCOMMANDS:
        assert re.search(rf"^  {command} +\w", shown.stdout, re.MULTILINE), f"{command} has no line in --help:\n{shown.stdout}"
    assert "torchlab-tui COMMAND --help" in shown.stdout
    said = " ".join(shown.stdout.split())  # as read, across argparse's line breaks
    assert re.findall(r"\(default[^)]*\) \(default[^)]*\)", said) == [], "a default stated twice"
    assert "--no-checkpointing no checkpointing of any block (the default)" in said


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_a_subcommands_help_is_written_for_users(command, capsys):
    """In this process (the installed command's --help is the test above): the help is the parser's text."""
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    shown = capsys.readouterr()
    assert exit_info.value.code == 0, shown.err
    assert f"usage: torchlab-tui {command}" in shown.out
    assert "``" not in shown.out and ".py" not in shown.out, shown.out


def test_a_file_without_a_factory_runs_its_workload_factory(tmp_path):
    assert run_cli(tmp_path, str(TINY), "--steps", "2") == EXIT_OK  # tiny.py:workload, as uvicorn and torchrun take a file
    assert read_jsonl(only_run_dir(tmp_path) / "metrics.jsonl")[-1]["step"] == 2
    assert only_run_dir(tmp_path).name.endswith("-tiny")


def test_a_file_with_no_workload_factory_lists_the_ones_it_has_without_running_it(tmp_path, capsys):
    model = tmp_path / "my_model.py"
    ran = tmp_path / "ran"
    model.write_text(
        f"open({str(ran)!r}, 'w').close()  # a side effect: the listing must not run the file\n"
        "def build(width=8):\n    pass\n"
        "def with_data(path):\n    pass\n"
        "def _private():\n    pass\n"
        "def make_model(*, depth=2, **extra):\n    pass\n"
    )
    assert run_cli(tmp_path, str(model)) == EXIT_USAGE
    assert capsys.readouterr().err == (
        f"torchlab-tui: error: workload file {model} defines no workload() for torchlab to call; name the factory to "
        f"call after a colon, one of the functions it defines that take no arguments: {model}:build, {model}:make_model.\n"
    )
    assert not ran.exists()


def test_a_second_attach_is_refused_with_exit_2_as_bad_input_is(tmp_path, capsys, monkeypatch):
    from torchlab.core.launch.attach import main as attach
    from torchlab.core.wire.runtime import Endpoint, listen_privately

    runtime = tmp_path / "xdg"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    endpoint = Endpoint.create("controlled")
    with listen_privately(endpoint.socket_path):  # a live trainer's socket, an app attached to it
        endpoint.write_info({"pid": os.getpid(), "run_dir": str(tmp_path / "run"), "state": "running", "step": 3, "attached": True})
        assert attach(["controlled"]) == EXIT_USAGE
    assert "another app is attached to controlled" in capsys.readouterr().err
