"""The run directory's files stay whole after any fault, shown with faults injected at the write calls
(no mount needed: tests/product/test_full_disk.py does the same on a real full file system where it can).

- A JSON-lines file gets a line whole or not at all; one that ends in a torn line is repaired on open.
- The rows of ``metrics.jsonl`` that a resume trains again are moved to ``metrics.replaced.jsonl``.
- A checkpoint, ``config.toml``, ``impact.json`` and a profile are written whole or not at all, with the
  one clear message, and leave no temporary file.
- A truncated or corrupt checkpoint says so, and names the newest intact one beside it (a damaged one, whose digest
  does not match, too: tests/launch/test_resume_untrusted.py).
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import pytest
import torch

from metrics_rows import metrics_row as any_row
from trainers import make_trainer
from torchlab.core.analysis.impact import ImpactTracker
from torchlab.core.engine.state import checkpoint as checkpoint_module
from torchlab.core.engine.measure import profiler as profiler_module
from torchlab.core.engine.measure import profile_tables
from torchlab.core.engine.state.checkpoint import load_checkpoint, save_checkpoint
from torchlab.core.errors import ConfigError, StorageError
from torchlab.core.launch.cli import main
from torchlab.core.records import rundir, storage
from torchlab.core.records.rundir import RunDirectory
from torchlab.core.wire.events import ResumedFromCheckpoint
from torchlab.core.wire.metrics_row import MetricsRow
from torchlab.core.wire.protocol import Error


# ----------------------------------------------------------------------------- helpers
@pytest.fixture(autouse=True)
def rows_written_as_they_come(monkeypatch):
    """Each row written as it comes, as a run's are when its steps are 50 ms or more apart: these tests are about
    what one write does. Rows held and written together: the tests under "held rows" below."""
    monkeypatch.setattr(rundir, "ROWS_WRITTEN_AT_ONCE_BELOW_S", 0.0)


def jsonl(path: Path) -> list[dict]:
    """Every line of a .jsonl file, parsed: a line that does not parse fails the test."""
    return [json.loads(line) for line in path.read_text().splitlines(keepends=True) if _whole(line, path)]


def _whole(line: str, path: Path) -> bool:
    assert line.endswith("\n"), f"{path.name} ends in a torn line: {line[:80]!r}"
    return True


def temporaries(directory: Path) -> list[Path]:
    return [path for path in directory.rglob("*") if ".tmp-" in path.name or path.name.endswith(".tmp")]


def fail_writes_to(monkeypatch, name: str, *, after_bytes: int = 0, short: bool = False) -> None:
    """``os.write`` to a file called ``name`` writes ``after_bytes`` of its data, then fails as a full disk does:
    with ENOSPC, or (``short``) by returning fewer bytes than it was given. Other writes go through."""
    real_write = os.write

    def write(descriptor: int, data) -> int:
        try:
            target = os.readlink(f"/proc/self/fd/{descriptor}")
        except OSError:
            return real_write(descriptor, data)
        if Path(target).name != name:
            return real_write(descriptor, data)
        written = real_write(descriptor, bytes(data)[:after_bytes]) if after_bytes else 0
        if short:
            return written
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", write)


class _FileThatFills:
    """A binary file that takes ``room`` bytes and then fails as a full disk does."""

    def __init__(self, path, room: int) -> None:
        self._handle = open(path, "wb")
        self.room = room

    def write(self, data) -> int:
        data = bytes(data)
        if len(data) > self.room:
            self._handle.write(data[: self.room])
            self.room = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return self._handle.write(data)

    def __getattr__(self, name):
        return getattr(self._handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self._handle.close()


def metrics_row(step: int, **extra) -> MetricsRow:
    return any_row(step, loss=1.0 / step, **extra)


# ----------------------------------------------------------------------------- whole lines
@pytest.mark.parametrize("short", [False, True], ids=["write fails", "short write"])
def test_a_line_the_disk_cannot_take_is_not_written_at_all(tmp_path, monkeypatch, short):
    directory = RunDirectory(tmp_path)
    directory.on_metrics(metrics_row(1))
    before = (tmp_path / "metrics.jsonl").read_bytes()
    fail_writes_to(monkeypatch, "metrics.jsonl", after_bytes=7, short=short)
    with pytest.raises(StorageError) as raised:
        directory.on_metrics(metrics_row(2))
    monkeypatch.undo()
    directory.close()
    assert (tmp_path / "metrics.jsonl").read_bytes() == before  # not half a line
    assert str(raised.value).startswith(f"no space left on device writing metrics.jsonl in {tmp_path}; ")
    assert "its lines before this one are whole" in str(raised.value)


def test_a_torn_last_line_is_cut_off_when_the_run_directory_opens_and_an_event_says_so(tmp_path):
    whole = "".join(json.dumps(metrics_row(step).json_object()) + "\n" for step in (1, 2, 3))
    (tmp_path / "metrics.jsonl").write_text(whole + '{"step": 4, "lo')
    (tmp_path / "events.jsonl").write_text('{"event": "run_started", "step": 0, "time": 1.0}\n{"event": "checkp')
    directory = RunDirectory(tmp_path)
    directory.close()
    assert (tmp_path / "metrics.jsonl").read_text() == whole
    events = jsonl(tmp_path / "events.jsonl")
    repairs = {event["file"]: event for event in events if event["event"] == "journal_repaired"}
    assert set(repairs) == {"events.jsonl", "metrics.jsonl"}
    assert repairs["metrics.jsonl"]["bytes_dropped"] == len('{"step": 4, "lo') and repairs["metrics.jsonl"]["step"] == 3
    assert repairs["events.jsonl"]["bytes_dropped"] == len('{"event": "checkp')
    assert all({"step", "time"} <= set(event) for event in events)


def test_a_last_line_that_does_not_parse_is_dropped_too(tmp_path):
    """A power cut can leave a file ending in a block of zeros (and a newline after them)."""
    whole = json.dumps(metrics_row(1).json_object()) + "\n"
    (tmp_path / "system.jsonl").write_bytes(whole.encode() + b"\0" * 300 + b"\n")
    RunDirectory(tmp_path).close()
    assert (tmp_path / "system.jsonl").read_text() == whole
    [repair] = [e for e in jsonl(tmp_path / "events.jsonl") if e["event"] == "journal_repaired"]
    assert repair["file"] == "system.jsonl" and repair["bytes_dropped"] == 301


def test_a_failed_telemetry_write_stops_the_run_at_its_next_metrics_row(tmp_path, links_followed):
    """The sampler's thread cannot stop the run: the run directory keeps the failure for the training thread."""
    (tmp_path / "system.jsonl").symlink_to("/dev/full")
    directory = RunDirectory(tmp_path)
    directory.on_telemetry({"time": 1.0, "step": 1, "host": {}})  # on the sampler's thread: does not raise
    with pytest.raises(StorageError, match="no space left on device writing system.jsonl"):
        directory.on_metrics(metrics_row(2))
    directory.on_event(Error(step=2, message="...", traceback=""))  # the error is still journaled
    directory.close()
    assert [e["event"] for e in jsonl(tmp_path / "events.jsonl")] == ["error"]


def test_an_error_the_journal_cannot_take_is_not_hidden_behind_the_journals_own(tmp_path, links_followed):
    """A resume that fails on a full disk: the user reads why the resume failed, not only that the disk is full."""
    (tmp_path / "events.jsonl").symlink_to("/dev/full")
    directory = RunDirectory(tmp_path)
    failure = directory.record_error("--resume x.pt: truncated or not a checkpoint")
    directory.close()
    assert isinstance(failure, StorageError) and "writing events.jsonl" in str(failure)


# ----------------------------------------------------------------------------- held rows
@pytest.fixture
def held_rows(monkeypatch):
    """The run's own rule (rows under 50 ms apart held), on a clock the test moves."""
    monkeypatch.setattr(rundir, "ROWS_WRITTEN_AT_ONCE_BELOW_S", 0.05)
    clock = types.SimpleNamespace(now=100.0)
    monkeypatch.setattr(rundir, "time", types.SimpleNamespace(monotonic=lambda: clock.now, strftime=time.strftime))
    return clock


def steps_in(path: Path) -> list[int]:
    return [row["step"] for row in jsonl(path)] if path.exists() else []


def test_fast_rows_are_held_and_written_before_the_next_event_line(tmp_path, held_rows):
    directory = RunDirectory(tmp_path)
    for step in range(1, 6):
        directory.on_metrics(metrics_row(step))
        held_rows.now += 0.01
    assert steps_in(tmp_path / "metrics.jsonl") == [1]  # the first came after none: written at once
    directory.on_event(Error(step=6, message="any event", traceback=""))
    assert steps_in(tmp_path / "metrics.jsonl") == [1, 2, 3, 4, 5]
    directory.on_metrics(metrics_row(6))  # 10 ms after the last: held
    held_rows.now += 1.0
    directory.on_metrics(metrics_row(7))  # a second after the last: written, and what was held with it
    assert steps_in(tmp_path / "metrics.jsonl") == [1, 2, 3, 4, 5, 6, 7]
    directory.close()


def test_rows_are_held_at_most_a_quarter_second_and_32_at_a_time_and_closing_writes_them(tmp_path, held_rows):
    directory = RunDirectory(tmp_path)
    directory.on_metrics(metrics_row(1))
    for step in range(2, 2 + rundir.HELD_ROWS):
        held_rows.now += 0.001
        directory.on_metrics(metrics_row(step))
    assert steps_in(tmp_path / "metrics.jsonl") == list(range(1, 2 + rundir.HELD_ROWS))  # 32 held: written
    step = 2 + rundir.HELD_ROWS
    while held_rows.now < 100.0 + rundir.HELD_FOR_S + 0.2:
        held_rows.now += 0.04
        directory.on_metrics(metrics_row(step))
        written = steps_in(tmp_path / "metrics.jsonl")
        assert step - written[-1] <= rundir.HELD_FOR_S / 0.04 + 1  # none held longer than a quarter second
        step += 1
    directory.on_metrics(metrics_row(step))
    directory.close()
    assert steps_in(tmp_path / "metrics.jsonl") == list(range(1, step + 1))


def test_held_rows_the_disk_cannot_take_are_not_written_at_all_and_the_event_says_so(tmp_path, monkeypatch, held_rows):
    directory = RunDirectory(tmp_path)
    directory.on_metrics(metrics_row(1))
    for step in (2, 3):
        held_rows.now += 0.01
        directory.on_metrics(metrics_row(step))
    before = (tmp_path / "metrics.jsonl").read_bytes()
    fail_writes_to(monkeypatch, "metrics.jsonl", after_bytes=30)
    with pytest.raises(StorageError, match="no space left on device writing metrics.jsonl"):
        directory.on_event(Error(step=4, message="any event", traceback=""))
    monkeypatch.undo()
    directory.close()
    assert (tmp_path / "metrics.jsonl").read_bytes() == before  # rows 2 and 3 whole or not at all: not


# ----------------------------------------------------------------------------- replayed rows
KILLED = textwrap.dedent("""
    import itertools, os, signal, time
    from tiny import workload as tiny

    def workload():
        built = tiny()
        kill_at = os.environ.get("KILL_AT_FORWARD")
        if kill_at:
            calls = itertools.count(1)

            def kill(module, inputs, output):
                time.sleep(0.06)  # steps over 50 ms apart: each row is written as it comes (rundir.py)
                if next(calls) == int(kill_at):
                    os.kill(os.getpid(), signal.SIGKILL)

            built.model.register_forward_hook(kill)
        return built
""")


def headless_run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    python_path = os.pathsep.join(filter(None, [str(Path(__file__).parent.parent / "workloads"), os.environ.get("PYTHONPATH")]))
    environment = {**os.environ, "PYTHONPATH": python_path, **(env or {})}
    return subprocess.run([sys.executable, "-m", "torchlab.core.launch.cli", *args, "--headless", "--telemetry-interval", "0",
                           "--eval-every", "0"], capture_output=True, text=True, env=environment, timeout=120)


def test_rows_a_resume_trains_again_are_moved_aside_so_each_step_is_in_metrics_once(tmp_path, monkeypatch):
    """kill -9 after step 12 with checkpoints every 5: the resume from step 10 replays 11 and 12. The probe is off: a
    measured step's row waits for the next step's transfer, so with it on, whether row 12 was out by the kill would
    depend on the auto cadence, which depends on the machine's load. The killed run is a process of its own; the
    resume is ``cli.main`` here (the same code path, without a second torch import)."""
    (tmp_path / "killed.py").write_text(KILLED)
    run = tmp_path / "run"
    killed = headless_run(f"{tmp_path / 'killed.py'}:workload", "--steps", "15", "--checkpoint-every", "5",
                          "--probe-every", "0", "--run-dir", str(run), env={"KILL_AT_FORWARD": "13"})
    assert killed.returncode == -signal.SIGKILL
    assert [row["step"] for row in jsonl(run / "metrics.jsonl")] == list(range(1, 13))
    first_rows = {row["step"]: row for row in jsonl(run / "metrics.jsonl")}
    monkeypatch.syspath_prepend(str(Path(__file__).parent.parent / "workloads"))  # killed.py imports tiny, as on PYTHONPATH
    assert main(["--resume", str(run), "--headless", "--telemetry-interval", "0", "--eval-every", "0"]) == 0
    assert [row["step"] for row in jsonl(run / "metrics.jsonl")] == list(range(1, 16))  # each step once
    assert jsonl(run / "metrics.replaced.jsonl") == [first_rows[11], first_rows[12]]  # as they were written
    [moved] = [e for e in jsonl(run / "events.jsonl") if e["event"] == "metrics_moved_aside"]
    assert (moved["step"], moved["rows"], moved["first_step"], moved["last_step"]) == (10, 2, 11, 12)
    assert moved["file"] == "metrics.replaced.jsonl"


def test_a_resume_with_no_row_after_its_step_moves_nothing(tmp_path, monkeypatch):
    """A relaunch for a new world size resumes from the step it stopped at: no rewrite, no event."""
    monkeypatch.setattr(storage, "TAIL_CHUNK", 5)  # lines longer than a read: read back in pieces
    directory = RunDirectory(tmp_path)
    for step in range(1, 6):
        directory.on_metrics(metrics_row(step, grad_norms={f"layer{i}": float(i) for i in range(step * 3)}))
    before = (tmp_path / "metrics.jsonl").read_bytes()
    directory.on_event(ResumedFromCheckpoint(step=5))
    assert (tmp_path / "metrics.jsonl").read_bytes() == before and not (tmp_path / "metrics.replaced.jsonl").exists()
    directory.on_event(ResumedFromCheckpoint(step=3))
    directory.on_metrics(metrics_row(4))
    directory.close()
    assert [row["step"] for row in jsonl(tmp_path / "metrics.jsonl")] == [1, 2, 3, 4]
    assert [row["step"] for row in jsonl(tmp_path / "metrics.replaced.jsonl")] == [4, 5]
    events = [e for e in jsonl(tmp_path / "events.jsonl") if e["event"] == "metrics_moved_aside"]
    assert [(e["step"], e["rows"]) for e in events] == [(3, 2)]


def test_a_side_file_the_disk_cannot_take_leaves_metrics_as_it_was(tmp_path, monkeypatch):
    directory = RunDirectory(tmp_path)
    for step in range(1, 6):
        directory.on_metrics(metrics_row(step))
    before = (tmp_path / "metrics.jsonl").read_bytes()
    fail_writes_to(monkeypatch, "metrics.replaced.jsonl", after_bytes=20)
    with pytest.raises(StorageError, match="no space left on device writing metrics.replaced.jsonl .*metrics.jsonl is as it was"):
        directory.on_event(ResumedFromCheckpoint(step=2))
    monkeypatch.undo()
    directory.close()
    assert (tmp_path / "metrics.jsonl").read_bytes() == before
    assert not (tmp_path / "metrics.replaced.jsonl").exists()


# ----------------------------------------------------------------------------- checkpoints
def test_a_full_disk_inside_torch_save_is_a_clear_error_and_leaves_no_temporary(tmp_path, monkeypatch):
    """torch's zip writer turns the failed write into 'RuntimeError: ... unexpected pos': the reason is kept."""
    save_checkpoint(tmp_path, 5, {"weights": torch.ones(1000)}, keep=3)
    monkeypatch.setattr(checkpoint_module, "open", lambda path, mode, opener: _FileThatFills(path, room=1500), raising=False)
    with pytest.raises(StorageError) as raised:
        save_checkpoint(tmp_path, 10, {"weights": torch.zeros(1000)}, keep=3)
    monkeypatch.undo()
    assert str(raised.value) == (
        f"no space left on device writing the checkpoint of step 10 in {tmp_path}; the previous checkpoint "
        "(step-0000005.pt, which last.pt points at) is intact: free some space, then resume from it."
    )
    assert sorted(path.name for path in tmp_path.iterdir()) == ["last.pt", "step-0000005.pt"]
    assert torch.equal(load_checkpoint(tmp_path / "last.pt")["weights"], torch.ones(1000))


def test_a_save_that_fails_for_another_reason_propagates_as_it_is_and_leaves_no_temporary(tmp_path):
    with pytest.raises(Exception) as raised:
        save_checkpoint(tmp_path, 1, {"not saveable": lambda: None}, keep=3)
    assert not isinstance(raised.value, StorageError)
    assert list(tmp_path.iterdir()) == []


def _three_checkpoints(directory: Path) -> None:
    for step in (5, 10, 15):
        save_checkpoint(directory, step, {"step": step, "weights": torch.full((2000,), float(step)), "config": "x = 1"}, keep=3)


@pytest.mark.parametrize("mmap", [False, True])
def test_a_truncated_last_pt_says_so_and_names_the_newest_intact_step_file(tmp_path, mmap):
    _three_checkpoints(tmp_path)
    last = tmp_path / "last.pt"
    os.truncate(last, last.stat().st_size // 2)  # a hard link: step-0000015.pt is truncated with it
    with pytest.raises(ConfigError) as raised:
        load_checkpoint(tmp_path, mmap=mmap)
    message = str(raised.value)
    assert message.startswith(f"--resume {last}: truncated or not a checkpoint")
    assert message.endswith(f"The newest intact checkpoint beside it is step-0000010.pt: resume from it with --resume {tmp_path / 'step-0000010.pt'}.")
    assert "weights_only" not in message and "Errno" not in message and "miniz" not in message


def test_a_corrupt_last_pt_names_the_newest_intact_step_file(tmp_path):
    _three_checkpoints(tmp_path)
    last = tmp_path / "last.pt"
    last.unlink()
    last.write_bytes(b"\0" * 4096)  # a copy that was overwritten (not the step file's link)
    with pytest.raises(ConfigError) as raised:
        load_checkpoint(tmp_path)
    assert "truncated or not a checkpoint" in str(raised.value) and "weights_only" not in str(raised.value)
    assert f"resume from it with --resume {tmp_path / 'step-0000015.pt'}." in str(raised.value)


def test_a_foreign_file_says_not_a_checkpoint_without_torchs_advice(tmp_path):
    torch.save({"model": torch.nn.Linear(2, 2)}, tmp_path / "objects.pt")  # loading it would run code
    with pytest.raises(ConfigError) as raised:
        load_checkpoint(tmp_path / "objects.pt")
    assert str(raised.value).startswith(f"--resume {tmp_path / 'objects.pt'}: truncated or not a checkpoint")
    assert "weights_only" not in str(raised.value) and "instead" not in str(raised.value)


def test_a_checkpoint_mapped_into_memory_gives_its_small_entries(tmp_path):
    _three_checkpoints(tmp_path)
    state = load_checkpoint(tmp_path, mmap=True)
    assert (state["step"], state["config"]) == (15, "x = 1") and float(state["weights"][0]) == 15.0


# ----------------------------------------------------------------------------- config.toml, impact.json
def test_config_toml_is_written_whole_or_left_as_it_was(tmp_path, monkeypatch):
    directory = RunDirectory(tmp_path)
    directory.write_config('workload = "a"\n')
    fail_writes_to(monkeypatch, ".config.toml.tmp-" + str(os.getpid()), after_bytes=3)
    with pytest.raises(StorageError, match="no space left on device writing config.toml .*config.toml is as it was"):
        directory.write_config('workload = "b"\n')
    monkeypatch.undo()
    directory.close()
    assert (tmp_path / "config.toml").read_text() == 'workload = "a"\n' and temporaries(tmp_path) == []


def test_a_changed_configuration_keeps_the_earlier_one_beside_it(tmp_path, monkeypatch):
    directory = RunDirectory(tmp_path)
    directory.write_config('workload = "a"\n')
    kept = directory.replace_config('workload = "b"\n', step=20)
    assert kept == tmp_path / "config.before-step-0000020.toml" and kept.read_text() == 'workload = "a"\n'
    assert directory.replace_config('workload = "c"\n', step=20).name == "config.before-step-0000020-2.toml"
    fail_writes_to(monkeypatch, f".config.toml.tmp-{os.getpid()}")
    with pytest.raises(StorageError, match="config.toml is as it was"):
        directory.replace_config('workload = "d"\n', step=30)
    monkeypatch.undo()
    directory.close()
    assert (tmp_path / "config.toml").read_text() == 'workload = "c"\n'
    assert not (tmp_path / "config.before-step-0000030.toml").exists() and temporaries(tmp_path) == []


def test_impact_json_is_replaced_whole_or_left_as_it_was(tmp_path, monkeypatch):
    tracker = ImpactTracker(tmp_path / "impact.json")
    tracker.on_metrics(any_row(1, step_time_s=0.1, samples_per_s=160.0, loss=1.0, amp="off"))
    tracker.write()
    before = (tmp_path / "impact.json").read_text()
    fail_writes_to(monkeypatch, f".impact.json.tmp-{os.getpid()}", after_bytes=10)
    with pytest.raises(StorageError, match="no space left on device writing impact.json"):
        tracker.on_metrics(any_row(2, step_time_s=0.1, samples_per_s=160.0, loss=0.9, amp="bf16"))
    monkeypatch.undo()
    assert (tmp_path / "impact.json").read_text() == before and temporaries(tmp_path) == []


# ----------------------------------------------------------------------------- profiles
def test_a_table_the_disk_cannot_take_is_reported_by_the_table_builder(tmp_path, monkeypatch, capsys):
    (tmp_path / "trace.json").write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 5, "args": {}}]}))
    fail_writes_to(monkeypatch, f".table.csv.tmp-{os.getpid()}", after_bytes=10)
    assert profile_tables.main([str(tmp_path)]) == profile_tables.EXIT_STORAGE
    monkeypatch.undo()
    assert json.loads(capsys.readouterr().out)["errno"] == errno.ENOSPC
    assert temporaries(tmp_path) == [] and not (tmp_path / "table.csv").exists()


def test_a_profile_the_disk_cannot_take_is_reported_failed_and_leaves_nothing(tmp_path, monkeypatch):
    real_run = subprocess.run

    def tables_fail(command, **kwargs):
        if command[1:3] == ["-m", "torchlab.core.engine.measure.profile_tables"]:
            real_run(command, **kwargs)  # writes into the staging folder, which must then go
            failure = {"errno": errno.ENOSPC, "strerror": os.strerror(errno.ENOSPC), "file": None}
            return subprocess.CompletedProcess(command, profile_tables.EXIT_STORAGE, json.dumps(failure), "")
        return real_run(command, **kwargs)

    monkeypatch.setattr(profiler_module.subprocess, "run", tables_fail)
    trainer, seen = make_trainer(steps=8, profiles_dir=tmp_path / "profiles", profile_at=(2,), profile_steps=2,
                                 telemetry_interval=0)
    assert trainer.run().status == "finished"  # a profile that fails does not end the run
    [report] = seen.of("profile")
    assert report["error"] == (
        f"no space left on device writing the profile of steps 3–4 in {tmp_path / 'profiles' / '0000002'}; none of it "
        "was kept, and training goes on: free some space, then profile again."
    )
    assert list((tmp_path / "profiles").iterdir()) == []


def test_when_a_checkpoint_is_written_the_rows_of_every_step_it_holds_are_on_disk(tmp_path, monkeypatch):
    """A kill after a checkpoint is on disk must lose no row of its steps: the resumed run trains only those after
    it. A fast run's rows are held up to a quarter second, and a measured step's (the probe on every step here)
    waits for the next step's transfer; both are written before a checkpoint is (found killing a run at step 4's
    forward after the checkpoint of step 3: rows 2 and 3 were gone for good after the resume)."""
    from torchlab.core.engine import checkpointer

    directory = RunDirectory(tmp_path / "run")
    on_disk_at_checkpoint = {}
    write = checkpointer.write_checkpoint

    def write_and_look(folder, step, contents, **kept):
        on_disk_at_checkpoint[step] = [row["step"] for row in jsonl(tmp_path / "run" / "metrics.jsonl")]
        return write(folder, step, contents, **kept)

    monkeypatch.setattr(checkpointer, "write_checkpoint", write_and_look)
    (tmp_path / "checkpoints").mkdir()
    trainer, _ = make_trainer(steps=7, checkpoint_every=3, probe_every=1, checkpoint_dir=tmp_path / "checkpoints")
    trainer.reporter.observers.append(directory)
    assert trainer.run().status == "finished"
    directory.close()
    assert on_disk_at_checkpoint == {3: [1, 2, 3], 6: [1, 2, 3, 4, 5, 6], 7: list(range(1, 8))}
    assert [row["step"] for row in jsonl(tmp_path / "run" / "metrics.jsonl")] == list(range(1, 8))
    assert all("update_ratios" in row for row in jsonl(tmp_path / "run" / "metrics.jsonl"))  # each with its figures
