"""A run's figures for other tools (issue 16): TensorBoard event files while training (``--tensorboard``) and
afterwards (``export --tensorboard``), read back with TensorBoard's own reader; one flat CSV (``export --csv``)."""

from __future__ import annotations

import csv
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator as PluginEventAccumulator

from metrics_rows import metrics_row
from trainers import TINY, WORKLOADS
from torchlab.core.engine.measure.tensorboard import TRACE_NAME
from torchlab.core.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from torchlab.core.launch.cli import main
from torchlab.core.wire.payloads import PHASES
from torchlab.tui.run_history import RunHistory

OWN = WORKLOADS / "own_training.py"


def events_in(directory: Path) -> EventAccumulator:
    accumulator = EventAccumulator(str(directory), size_guidance={"scalars": 0, "tensors": 0})
    accumulator.Reload()
    return accumulator


def steps_of(accumulator: EventAccumulator, tag: str) -> list[int]:
    return [event.step for event in accumulator.Scalars(tag)]


def texts_of(accumulator: EventAccumulator, tag: str) -> list[str]:
    return [event.tensor_proto.string_val[0].decode() for event in accumulator.Tensors(f"{tag}/text_summary")]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A run of the workload with its own groups and accuracy: an option change, a profile, evaluations."""
    root = tmp_path_factory.mktemp("export")
    assert main([f"{OWN}:workload", "--headless", "--steps", "24", "--eval-every", "8", "--at", "10:clip=0.5",
                 "--profile-at", "12", "--profile-steps", "2", "--tensorboard", str(root / "live"),
                 "--run-dir", str(root / "run")]) == EXIT_OK
    return root


def test_while_training_the_scalars_option_changes_and_profile_go_to_tensorboard(trained):
    live = events_in(trained / "live")
    tags = set(live.Tags()["scalars"])
    assert {"train/loss", "train/lr/body", "train/lr/head", "train/accuracy", "val/loss", "val/accuracy",
            "train/samples_per_s", "grad_norm/head", "grad_norm/body.0", "update_ratio/head", "weight_norm/body.0"} <= tags
    assert steps_of(live, "val/loss") == [8, 16, 24]  # evaluations always; training rows at most 5 a second
    assert texts_of(live, "options") == ["step 10: clip = 0.5 (was off), from --at"]
    assert (trained / "live" / "plugins" / "profile" / "step-13" / "torchlab.pt.trace.json").stat().st_size > 1000


def test_export_writes_every_row_and_a_flat_csv(trained, capsys):
    assert main(["export", str(trained / "run"), "--tensorboard", str(trained / "exported"), "--csv", str(trained / "m.csv")]) == EXIT_OK
    exported = events_in(trained / "exported")
    assert steps_of(exported, "train/loss") == list(range(1, 25))
    assert steps_of(exported, "train/accuracy") == list(range(1, 25))
    assert texts_of(exported, "options") == ["step 10: clip = 0.5 (was off), from --at"]
    assert len(list((trained / "exported" / "plugins" / "profile").glob("step-*/torchlab.pt.trace.json"))) == 1
    with open(trained / "m.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [int(row["step"]) for row in rows] == list(range(1, 25))
    assert {"lrs.body", "lrs.head", "metrics.accuracy", "val_metrics.accuracy", "grad_norms.head", "clip",
            "update_ratios.head", "weight_norms.body.0"} <= set(rows[0])
    assert steps_of(exported, "update_ratio/head") == [int(row["step"]) for row in rows if row["update_ratios.head"]]
    timed = [int(row["step"]) for row in rows if row["phases.data_s"]]  # where the step's time went, on the probe's rows
    probed = [int(row["step"]) for row in rows if row["update_ratios.head"]]  # step 1: its FLOPs counted, not timed
    assert timed[-1] == 24 and set(timed) <= {*probed[1:], 24} and steps_of(exported, "time/forward_s") == timed
    assert steps_of(exported, "perf/mfu") == timed and all(0 < float(row["phases.flops"]) for row in rows if row["phases.data_s"])
    assert {f"phases.{phase}_s" for phase in PHASES} <= set(rows[0])
    assert rows[7]["val_metrics.accuracy"] != "" and rows[6]["val_metrics.accuracy"] == ""
    assert float(rows[-1]["metrics.accuracy"]) > 0.5
    assert "24 rows" in capsys.readouterr().err


def test_a_torn_last_line_is_left_out_of_the_csv(tmp_path):
    run = tmp_path / "run"
    assert main([TINY, "--headless", "--steps", "5", "--eval-every", "0", "--run-dir", str(run)]) == EXIT_OK
    with open(run / "metrics.jsonl", "a") as handle:
        handle.write('{"step": 6, "loss": 1.')  # a crash in the middle of a write
    assert main(["export", str(run), "--csv", str(tmp_path / "m.csv")]) == EXIT_OK
    assert len((tmp_path / "m.csv").read_text().splitlines()) == 1 + 5


def test_a_profile_a_killed_trainer_left_half_written_is_not_exported(trained, tmp_path, capsys):
    import shutil

    run = shutil.copytree(trained / "run", tmp_path / "run")
    (run / "profiles" / ".0000020.tmp-99999").mkdir()  # the profiler's staging folder, renamed only once whole
    (run / "profiles" / ".0000020.tmp-99999" / "trace.json").write_text('{"traceEvents": [')
    assert main(["export", str(run), "--tensorboard", str(tmp_path / "tb")]) == EXIT_OK
    assert [path.parent.name for path in (tmp_path / "tb" / "plugins" / "profile").glob("*/*.json")] == ["step-13"]
    assert "1 profiler traces" in capsys.readouterr().err


def test_another_users_private_run_is_refused_in_one_paragraph(trained, tmp_path, monkeypatch, capsys):
    import errno

    import torchlab.core.launch.export as export

    def private(path, *args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))  # what a 0700 run of someone else's gives

    monkeypatch.setattr(export, "open_regular", private)
    assert main(["export", str(trained / "run"), "--csv", str(tmp_path / "m.csv")]) == EXIT_USAGE
    assert capsys.readouterr().err.strip() == (f"torchlab-tui export: {trained / 'run'}: cannot be read: permission denied "
                                               "(a run directory is private to the user who started it)")
    assert not (tmp_path / "m.csv").exists()


@pytest.mark.parametrize("argv, message", [
    (["export", "nowhere"], "say what to write: --tensorboard DIR, --csv FILE, or both"),
    (["export", "nowhere", "--csv", "m.csv"], "nowhere: no metrics.jsonl here; give a run directory"),
])
def test_export_says_what_is_wrong_in_one_line(argv, message, capsys):
    assert main(argv) == EXIT_USAGE
    assert message in capsys.readouterr().err


def test_without_tensorboard_installed_the_flag_says_how_to_install_it_before_training(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails as without the extra
    assert main([TINY, "--headless", "--steps", "2", "--tensorboard", str(tmp_path / "tb"), "--run-dir", str(tmp_path / "run")]) == EXIT_USAGE
    assert "TensorBoard is not installed: pip install 'torchlab-tui[tensorboard]'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # nothing started


def test_a_resumed_run_hides_what_the_first_process_wrote_after_its_checkpoint(tmp_path):
    run, board = tmp_path / "run", tmp_path / "tb"
    assert main([TINY, "--headless", "--steps", "12", "--eval-every", "4", "--checkpoint-every", "4",
                 "--tensorboard", str(board), "--run-dir", str(run)]) == EXIT_OK
    assert main(["--resume", str(run / "checkpoints" / "step-0000008.pt"), "--headless", "--steps", "16",
                 "--amp", "bf16"]) == EXIT_OK
    assert steps_of(events_in(board), "val/loss") == [4, 8, 12, 16]  # 12 once: the resumed process's
    # The resume's changed options are option changes, as in an export (option_history)
    assert texts_of(events_in(board), "options") == ["step 9: steps = 16 (was 12), from --resume",
                                                     "step 9: amp = bf16 (was off), from --resume"]


def test_a_resume_with_a_changed_option_continues_the_runs_impact_table_exports_and_history(tmp_path):
    """Issue 45: the app's restart from the error screen is ``--resume RUN --amp ...``. It continues the run: the
    impact table keeps the segments before it, the exported options text and the history the app replays on attach
    hold its change (``resume_changed_settings``), and what the first process did after the checkpoint, trained
    over, is in none of them."""
    run = tmp_path / "run"
    assert main([TINY, "--headless", "--steps", "30", "--checkpoint-every", "15", "--eval-every", "0",
                 "--at", "10:clip=1.0", "--at", "20:accum=2", "--run-dir", str(run)]) == EXIT_OK
    assert main(["--resume", str(run / "checkpoints" / "step-0000015.pt"), "--amp", "bf16", "--headless"]) == EXIT_OK

    impact = json.loads((run / "impact.json").read_text())
    assert [(row["change"], row["first_step"], row["last_step"]) for row in impact] == [
        ("start", 1, 9), ("clip=1.0", 10, 15), ("amp=bf16", 16, 19), ("accum=2", 20, 30)]

    assert main(["export", str(run), "--tensorboard", str(tmp_path / "tb"), "--csv", str(tmp_path / "m.csv")]) == EXIT_OK
    assert texts_of(events_in(tmp_path / "tb"), "options") == [
        "step 10: clip = 1.0 (was off), from --at", "step 16: amp = bf16 (was off), from --resume",
        "step 20: accum = 2 (was 1), from --at"]
    with open(tmp_path / "m.csv", newline="") as handle:
        assert [(int(row["step"]), row["amp"]) for row in csv.DictReader(handle)][14:16] == [(15, "off"), (16, "bf16")]
    assert RunHistory.load(run).changes == ["step 10: clip = 1.0", "step 16: amp = bf16", "step 20: accum = 2"]


def test_a_restarted_run_that_fails_again_keeps_the_segment_it_trained_in_its_impact_table(tmp_path):
    """Seen in the app: restarted from the error screen with amp bf16, the run trained 60 steps and failed again,
    and its impact table said 'amp=bf16: steps 121-121, too few steps to judge': a process that failed never wrote
    (nor sent) its last segment, only one that ended did."""
    run = tmp_path / "run"
    workload = f"{WORKLOADS / 'failing_later.py'}:raises_in_a_helper_at_step_6"  # the 6th forward of each process
    assert main([workload, "--headless", "--steps", "20", "--run-dir", str(run)]) == EXIT_FAILED
    assert main(["--resume", str(run), "--amp", "bf16", "--headless"]) == EXIT_FAILED
    impact = json.loads((run / "impact.json").read_text())
    assert [(row["change"], row["first_step"], row["last_step"]) for row in impact] == [("start", 1, 5), ("amp=bf16", 6, 10)]


def test_the_csv_has_a_column_per_module_for_memory_by_module_whatever_its_rank_in_a_row():
    """The list is ranked by size: as columns by place (memory.by_module.0.module) a column named another module
    from one row to the next (seen in an export of a real run)."""
    from torchlab.core.records.csv_export import flat_row

    first = flat_row({"step": 1, "memory": {"by_module": [{"module": "attn", "bytes": 9}, {"module": "mlp", "bytes": 4}]}})
    later = flat_row({"step": 2, "memory": {"by_module": [{"module": "mlp", "bytes": 12}, {"module": "attn", "bytes": 9}]}})
    assert first == {"step": 1, "memory.by_module.attn": 9, "memory.by_module.mlp": 4}
    assert later == {"step": 2, "memory.by_module.mlp": 12, "memory.by_module.attn": 9}


def test_csv_cells_a_spreadsheet_would_evaluate_begin_with_a_quote_and_numbers_stay_numbers(tmp_path):
    """OWASP's rule for CSV injection; a loss of -0.5 we wrote as a number is data, not a formula."""
    run = tmp_path / "run"
    run.mkdir()
    row = {"step": 1, "loss": -0.5, '=HYPERLINK("http://evil")': 1.0, "grad_norms": {"=cmd|' /C calc'!A0": 2.0},
           "notes": ["=1+1", "+1", "-1", "@SUM(A1)", "\tx", "\rx", "plain", "", "a=b"]}
    (run / "metrics.jsonl").write_text(json.dumps(row) + "\n")
    assert main(["export", str(run), "--csv", str(tmp_path / "m.csv")]) == EXIT_OK
    with open(tmp_path / "m.csv", newline="") as handle:
        header, cells = list(csv.reader(handle))
    assert header[:4] == ["step", "loss", '\'=HYPERLINK("http://evil")', "grad_norms.=cmd|' /C calc'!A0"]
    assert cells[:4] == ["1", "-0.5", "1.0", "2.0"]
    assert cells[4:] == ["'=1+1", "'+1", "'-1", "'@SUM(A1)", "'\tx", "'\rx", "plain", "", "a=b"]


# Issue 26: a run someone else prepared, and the paths an export writes to.

SECRET = '{"event": "option_applied", "step": 3, "option": "SECRET", "value": 1}\n'  # /etc/shadow stands for


@pytest.fixture
def umask():
    """The process umask is 022 for the test; the previous one is put back after it."""
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def run_copy(trained: Path, tmp_path: Path) -> Path:
    return shutil.copytree(trained / "run", tmp_path / "run")


def profile_folder(run: Path) -> Path:
    return next(folder for folder in (run / "profiles").iterdir() if folder.name.isdigit())


def files_holding(folder: Path, text: str) -> list[Path]:
    return [path for path in folder.rglob("*") if path.is_file() and text.encode() in path.read_bytes()]


def cli(*argv: str) -> subprocess.CompletedProcess:
    """``torchlab-tui`` in a process of its own: a hang is a timeout, not a test run that never ends."""
    return subprocess.run([sys.executable, "-m", "torchlab.core.launch.cli", *argv], capture_output=True, text=True, timeout=60)


def plant_linked_trace(run: Path, secret: Path) -> Path:
    trace = profile_folder(run) / "trace.json"
    trace.unlink()
    trace.symlink_to(secret)
    return trace


def plant_linked_profile_folder(run: Path, secret: Path) -> Path:
    folder = profile_folder(run)
    shutil.rmtree(folder)
    elsewhere = secret.parent / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "trace.json").write_text(secret.read_text())
    folder.symlink_to(elsewhere)
    return folder


def plant_linked_events(run: Path, secret: Path) -> Path:
    events = run / "events.jsonl"
    events.unlink()
    events.symlink_to(secret)
    return events


@pytest.mark.parametrize("plant", [plant_linked_trace, plant_linked_profile_folder, plant_linked_events])
def test_export_copies_no_link_in_the_run_it_reads(trained, tmp_path, capsys, plant):
    """A ``trace.json`` linked to /etc/shadow was copied into the TensorBoard folder, world-readable (run as root)."""
    secret = tmp_path / "shadow"
    secret.write_text(SECRET)
    planted = plant(run_copy(trained, tmp_path), secret)
    assert main(["export", str(tmp_path / "run"), "--tensorboard", str(tmp_path / "tb")]) == EXIT_OK
    assert files_holding(tmp_path / "tb", "SECRET") == []
    assert [folder for folder in (tmp_path / "tb").rglob("*") if folder.is_dir() and not any(folder.iterdir())] == []
    warnings = [line for line in capsys.readouterr().err.splitlines() if "skipped" in line]
    assert warnings == [f"torchlab-tui export: skipped {planted}: a symbolic link, which export never follows "
                        "(it could point at any file of yours); the rest is exported"]


def test_a_new_tensorboard_folder_is_private_and_so_is_what_is_copied_into_it(trained, tmp_path, umask):
    assert main(["export", str(trained / "run"), "--tensorboard", str(tmp_path / "tb")]) == EXIT_OK
    (trace,) = (tmp_path / "tb").rglob(TRACE_NAME)
    assert mode(tmp_path / "tb") == 0o700 and mode(trace.parent) == 0o700 and mode(trace) == 0o600


@pytest.mark.parametrize("journal", ["fifo", "link"])
def test_a_journal_that_is_not_a_regular_file_is_refused_at_once_in_one_paragraph(tmp_path, journal):
    """A FIFO as metrics.jsonl blocked export for ever; a link was read through."""
    run = tmp_path / "run"
    run.mkdir()
    if journal == "fifo":
        os.mkfifo(run / "metrics.jsonl")
    else:
        (tmp_path / "notes.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
        (run / "metrics.jsonl").symlink_to(tmp_path / "notes.jsonl")
    done = cli("export", str(run), "--csv", str(tmp_path / "m.csv"))
    kind = "a FIFO (named pipe)" if journal == "fifo" else "a symbolic link"
    assert done.returncode == EXIT_USAGE
    assert done.stderr.startswith(f"torchlab-tui export: {run / 'metrics.jsonl'} is {kind}, not a regular file")
    assert done.stderr.count("\n") == 1
    assert not (tmp_path / "m.csv").exists()


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_csv_onto_the_runs_own_journal_is_refused_and_leaves_it_byte_identical(trained, tmp_path, force):
    """``export RUN --csv RUN/metrics.jsonl`` cut a 78 KB journal to one header line, said "0 rows" and exited 0."""
    run = run_copy(trained, tmp_path)
    journal = (run / "metrics.jsonl").read_bytes()
    done = cli("export", str(run), "--csv", str(run / "metrics.jsonl"), *force)
    assert (done.returncode, done.stdout) == (EXIT_USAGE, "")
    assert done.stderr == (f"torchlab-tui export: --csv {run / 'metrics.jsonl'} is in the run directory {run}: an export "
                           "writes nothing into a run, whose own files it would replace. Give a path outside it, "
                           f"such as --csv {tmp_path / 'run.csv'}.\n")
    assert (run / "metrics.jsonl").read_bytes() == journal


@pytest.mark.parametrize("target", ["run", "run/tensorboard", "other/tensorboard"])
def test_tensorboard_into_a_run_directory_is_refused_even_with_force(trained, tmp_path, capsys, target):
    run = run_copy(trained, tmp_path)
    (tmp_path / "other" / "checkpoints").mkdir(parents=True)  # another run: its config and checkpoints
    (tmp_path / "other" / "config.toml").write_text('workload = "tiny_gpt"\n')
    before = sorted(tmp_path.rglob("*"))
    assert main(["export", str(run), "--tensorboard", str(tmp_path / target), "--force"]) == EXIT_USAGE
    assert "an export writes nothing into a run" in capsys.readouterr().err
    assert sorted(tmp_path.rglob("*")) == before


def test_csv_into_a_folder_holding_another_run_is_refused(trained, tmp_path, capsys):
    other = tmp_path / "other"
    other.mkdir()
    (other / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    assert main(["export", str(trained / "run"), "--csv", str(other / "m.csv")]) == EXIT_USAGE
    assert capsys.readouterr().err == (f"torchlab-tui export: --csv {other / 'm.csv'} is in {other}, which holds a "
                                       "torchlab run (its metrics.jsonl): an export writes nothing into a run, whose "
                                       f"own files it would replace. Give a path outside it, such as --csv {trained / 'run.csv'}.\n")
    assert not (other / "m.csv").exists()


def test_an_existing_csv_is_replaced_only_with_force(trained, tmp_path, capsys):
    target = tmp_path / "m.csv"
    target.write_text("a file of mine\n")
    assert main(["export", str(trained / "run"), "--csv", str(target)]) == EXIT_USAGE
    assert capsys.readouterr().err == (f"torchlab-tui export: --csv {target} exists: an export writes only to a new "
                                       "file. Give another name, or add --force to replace it.\n")
    assert target.read_text() == "a file of mine\n"
    assert main(["export", str(trained / "run"), "--csv", str(target), "--force"]) == EXIT_OK
    assert target.read_text().startswith("step,")


def test_force_replaces_a_link_at_the_csv_path_and_never_writes_through_it(trained, tmp_path, capsys):
    notes = tmp_path / "notes.txt"
    notes.write_text("the victim's notes\n")
    link = tmp_path / "m.csv"
    link.symlink_to(notes)
    assert main(["export", str(trained / "run"), "--csv", str(link)]) == EXIT_USAGE
    assert "exists (a symbolic link): an export writes only to a new file" in capsys.readouterr().err
    assert main(["export", str(trained / "run"), "--csv", str(link), "--force"]) == EXIT_OK
    assert notes.read_text() == "the victim's notes\n"
    assert not link.is_symlink() and link.read_text().startswith("step,")
    assert [path.name for path in tmp_path.iterdir() if path.name.startswith(".")] == []  # no temporary left


def test_a_tensorboard_folder_holding_files_is_written_into_only_with_force_and_shows_each_step_once(trained, tmp_path, capsys):
    board = tmp_path / "tb"
    assert main(["export", str(trained / "run"), "--tensorboard", str(board)]) == EXIT_OK
    capsys.readouterr()
    assert main(["export", str(trained / "run"), "--tensorboard", str(board)]) == EXIT_USAGE
    assert capsys.readouterr().err == (
        f"torchlab-tui export: --tensorboard {board} already holds files: an export writes into a new or empty "
        "folder. Give another, or add --force to write into it (TensorBoard then shows this export in place of "
        "what the folder held).\n")
    assert main(["export", str(trained / "run"), "--tensorboard", str(board), "--force"]) == EXIT_OK
    shown = PluginEventAccumulator(str(board), size_guidance={"tensors": 0})  # as TensorBoard's server reads it
    shown.Reload()
    assert [event.step for event in shown.Tensors("train/loss")] == list(range(1, 25))  # not twice: the first is hidden
    assert [event.step for event in shown.Tensors("options/text_summary")] == [10]


def test_an_empty_tensorboard_folder_of_ones_own_is_written_into(trained, tmp_path):
    (tmp_path / "tb").mkdir(mode=0o755)
    assert main(["export", str(trained / "run"), "--tensorboard", str(tmp_path / "tb")]) == EXIT_OK
    assert steps_of(events_in(tmp_path / "tb"), "train/loss") == list(range(1, 25))


def linked_folder(tmp_path: Path) -> str:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "tb").symlink_to(tmp_path / "elsewhere")
    return "is a symbolic link: an export writes into no folder through a link"


def folder_others_can_write(tmp_path: Path) -> str:
    (tmp_path / "tb").mkdir()
    (tmp_path / "tb").chmod(0o777)
    return "can be written by other users (mode 0777)"


@pytest.mark.parametrize("prepare", [linked_folder, folder_others_can_write])
def test_a_tensorboard_folder_someone_else_could_have_prepared_is_refused_even_with_force(trained, tmp_path, capsys, prepare):
    """TensorBoard names its event file by time, host and process: a link put there first would be written through."""
    expected = prepare(tmp_path)
    assert main(["export", str(trained / "run"), "--tensorboard", str(tmp_path / "tb"), "--force"]) == EXIT_USAGE
    assert expected in capsys.readouterr().err
    assert list((tmp_path / "tb").iterdir()) == []


def test_export_help_says_what_force_does_in_one_line(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit):
        main(["export", "--help"])
    lines = capsys.readouterr().out.splitlines()
    at = next(index for index, line in enumerate(lines) if line.lstrip().startswith("--force"))
    assert len(lines[at].split(None, 1)) == 2  # its help on the flag's own line
    assert not any(line.startswith(" " * 10) for line in lines[at + 1:at + 2])  # and no second line


def test_the_live_writer_writes_the_last_row_of_a_fast_run(tmp_path):
    """At most 5 rows a second go to TensorBoard while training; the last row is written all the same, when the
    run ends (a 30-step run's event file ended at step 28)."""
    from torchlab.core.engine.measure.tensorboard import LiveTensorBoard
    from torchlab.core.wire.events import RunEnded, RunStarted

    live = LiveTensorBoard(tmp_path / "tb")
    live.on_event(RunStarted(step=0, device="cpu", batch_size=8, steps=30, options={}, modules=[], module_params=[],
                             checkpoint_blocks=[], world_size=1, ranks=None))
    for step in range(1, 31):  # faster than 5 a second: most are not written
        live.on_metrics(metrics_row(step, loss=1.0 / step))
    live.on_event(RunEnded(step=30, status="finished"))
    written = steps_of(events_in(tmp_path / "tb"), "train/loss")
    assert written[-1] == 30 and len(written) < 30


def test_the_csv_has_no_column_for_a_figure_that_is_null_where_it_is_not_nested():
    """``grad_norms`` is null on the steps the probe skips and a dict on the others: a ``grad_norms`` column was
    empty in every row. A figure that is null in every row and nowhere nested keeps its column (``clip``)."""
    from torchlab.core.records.csv_export import csv_columns, flat_row

    rows = [{"step": 1, "clip": None, "grad_norms": {"blocks.0.attn": 1.5}}, {"step": 2, "clip": None, "grad_norms": None}]
    assert csv_columns(flat_row(row) for row in rows) == ["step", "clip", "grad_norms.blocks.0.attn"]


def test_the_csv_names_adams_moments_per_module():
    from torchlab.core.records.csv_export import flat_row

    assert flat_row({"step": 3, "adam": {"blocks.0": [0.5, 0.25]}, "update_ratios": {"blocks.0": 1e-3}}) == {
        "step": 3, "adam.blocks.0.m": 0.5, "adam.blocks.0.sqrt_v": 0.25, "update_ratios.blocks.0": 1e-3}


def test_stragglers_and_hangs_go_to_tensorboard_as_the_ranks_text_in_an_export(trained, tmp_path):
    """Each ``straggler`` and ``hang`` of the journal, in the words the app's log says them, at its step; live too."""
    from torchlab.core.engine.measure.tensorboard import LiveTensorBoard
    from torchlab.core.records.rundir import to_json_line
    from torchlab.core.wire.events import RunEnded, RunStarted
    from torchlab.core.wire.hang import Hang
    from torchlab.core.wire.straggler import Straggler

    run, exported = tmp_path / "run", tmp_path / "exported"
    shutil.copytree(trained / "run", run)
    slow = Straggler(step=12, rank=1, host="node-b", excess_s=0.05, step_share=0.2, since_step=4, part="data wait")
    said_events = [slow, Hang(step=20, waited_s=41.0, explanation="rank 1 at model.py:88", folder="hangs/step-0000020")]
    with (run / "events.jsonl").open("a") as journal:
        for event in said_events:
            journal.write(to_json_line(event.journal_record()) + "\n")
    assert main(["export", str(run), "--tensorboard", str(exported)]) == EXIT_OK
    live = LiveTensorBoard(tmp_path / "live")  # and while the run trains: the observer of the process that reports
    live.on_event(RunStarted(step=0, device="cpu", batch_size=8, steps=30, options={}, modules=[], module_params=[],
                             checkpoint_blocks=[], world_size=2, ranks=None))
    for event in said_events:
        live.on_event(event)
    live.on_event(RunEnded(step=30, status="finished"))
    for folder in (exported, tmp_path / "live"):
        said = texts_of(events_in(folder), "ranks")
        assert len(said) == 2 and said[0].startswith("straggler: rank 1 (node-b) 50.0 ms a step behind the others")
        assert said[1].startswith("hang: rank 1 at model.py:88; each rank's Python stack in hangs/step-0000020")


def test_what_compile_did_goes_to_tensorboard_live_and_in_an_export(tmp_path):
    """A run whose model breaks torch.compile's graph twice: the compile report's scalars (seconds, graphs, breaks,
    recompiles, ops run eagerly between graphs) at its step and each break as a line of the ``compile`` text, while it trains and exported after."""
    run, live, exported = tmp_path / "run", tmp_path / "live", tmp_path / "exported"
    assert main([f"{WORKLOADS / 'tiny.py'}:graph_breaks", "--headless", "--steps", "4", "--compile", "--tensorboard",
                 str(live), "--run-dir", str(run)]) == EXIT_OK
    assert main(["export", str(run), "--tensorboard", str(exported)]) == EXIT_OK
    for folder in (live, exported):
        events = events_in(folder)
        assert steps_of(events, "compile/graph_breaks") == [1, 1] and events.Scalars("compile/graph_breaks")[0].value == 2
        assert events.Scalars("compile/recompiles")[0].value == 0 and events.Scalars("compile/seconds")[0].value > 0
        assert [scalar.value for scalar in events.Scalars("compile/eager_ops")] == [1]  # counted after the compile: the branch's test
        *_, text = texts_of(events, "compile")  # each report's: the compile's, then with its census
        assert text.count("graph break at ") == 2 and "Data-dependent branching" in text
