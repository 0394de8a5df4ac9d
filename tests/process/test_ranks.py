"""Data-parallel runs on the CPU (gloo), in real processes: ranks started by PyTorch's elastic launcher.

Kept tiny (the TINY workload, a few steps): most of each test's time is the rank processes importing
torch. The supervisor runs in the test process (``main()``); the ranks are its children.
"""

from __future__ import annotations

import json
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from trainers import WORKLOADS, make_trainer
from processes import alive, forecasters_of
from test_worker import Collected
from torchlab.core.engine.state.checkpoint import load_checkpoint
from torchlab.core.engine.parallel.distributed import usable_cpus
from torchlab.core.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from torchlab.core.launch.cli import main
from torchlab.core.wire import protocol as p
from torchlab.tui.link import ProcessLink

TINY = WORKLOADS / "tiny.py"
pytestmark = pytest.mark.skipif(usable_cpus() < 2, reason="two ranks need two CPU cores")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def headless(run_dir: Path, *args: str) -> int:
    return main([*args, "--headless", "--run-dir", str(run_dir), "--telemetry-interval", "0"])


def rank_pids(events: list[dict]) -> list[int]:
    return [rank["pid"] for event in events if event["event"] == "run_started" for rank in event["ranks"] or []]


def test_world_size_2_from_the_start_trains_and_takes_live_changes_on_every_rank(tmp_path):
    run = tmp_path / "run"
    code = headless(run, f"{TINY}:workload", "--world-size", "2", "--steps", "24", "--lr", "0.01",
                    "--checkpoint-every", "10", "--eval-every", "12",
                    "--at", "5:checkpointing=on", "--at", "7:amp=bf16", "--at", "9:accum=2", "--at", "11:clip=0.5",
                    "--at", "13:amp=off", *[f"--at=15:lr_scale=0.{n:02d}" for n in range(18, 0, -1)])
    assert code == EXIT_OK
    metrics, events = read_jsonl(run / "metrics.jsonl"), read_jsonl(run / "events.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, 25)) and {m["world_size"] for m in metrics} == {2}
    losses = [m["loss"] for m in metrics]
    assert sum(losses[-4:]) < sum(losses[:4])
    # Every rank applied each change at the same step: a rank one micro-batch or option behind would
    # have deadlocked or crashed the collectives.
    applied = [(e["step"], e["option"]) for e in events if e["event"] == "option_applied"]
    # 18 changes at one boundary are more than one packet holds (1 KiB): they went over in several, in order
    assert applied == [(5, "checkpointing"), (7, "amp"), (9, "accum"), (11, "clip"), (13, "amp"), *[(15, "lr_scale")] * 18]
    assert metrics[14]["lr_scale"] == 0.01
    assert metrics[8]["accum"] == 2 and metrics[10]["clipped"] is not None and metrics[6]["amp"] == "bf16"
    assert [m["step"] for m in metrics if "val_loss" in m] == [12, 24]
    # Per-rank figures, gathered to rank 0 on the first report and then at most once a second.
    with_ranks = [m for m in metrics if "ranks" in m]
    assert with_ranks[0]["step"] == 1
    assert all([r["rank"] for r in m["ranks"]] == [0, 1] and all(r["step_time_s"] > 0 for r in m["ranks"]) for m in with_ranks)
    [started] = [e for e in events if e["event"] == "run_started"]
    assert started["world_size"] == 2 and len(set(rank_pids(events))) == 2
    # Each rank, read back in the rank: half the cores this run may use (core/engine/parallel/cpu_share.py), and OpenMP
    # threads that sleep when idle instead of spinning against the other rank (issue 45, item 9).
    assert [(r["threads"], r["omp_wait_policy"]) for r in started["ranks"]] == [(max(1, usable_cpus() // 2), "PASSIVE")] * 2
    assert [e["step"] for e in events if e["event"] == "checkpoint"] == [10, 20, 24]
    assert events[-1]["event"] == "run_ended" and events[-1]["status"] == "finished"
    state = load_checkpoint(run / "checkpoints" / "last.pt")
    assert state["step"] == 24 and len(state["rng_by_rank"]) == 2 and state["options"]["world_size"] == 2
    assert not any(alive(pid) for pid in rank_pids(events))


def test_world_size_2_compiles_the_ddp_wrapper_on_every_rank_and_checkpoints_the_models_own_keys(tmp_path):
    """torch.compile of the DDP module (as PyTorch advises); gradient accumulation's no_sync still holds under it,
    and a rank one step behind (compiling on its own) would have stopped the collectives."""
    run = tmp_path / "run"
    code = headless(run, f"{TINY}:workload", "--world-size", "2", "--steps", "10", "--checkpoint-every", "0",
                    "--at", "3:compile=on", "--at", "6:accum=2", "--at", "8:compile=off")
    assert code == EXIT_OK
    metrics, events = read_jsonl(run / "metrics.jsonl"), read_jsonl(run / "events.jsonl")
    applied = [(e["step"], e["option"], e["detail"].split(" in ")[0]) for e in events if e["event"] == "option_applied"]
    assert applied == [(3, "compile", "compiled"), (6, "accum", ""), (8, "compile", "")]
    assert [m["compile"] for m in metrics] == [False, False, True, True, True, True, True, False, False, False]
    assert not any(m.get("compiling") for m in metrics)
    state = load_checkpoint(run / "checkpoints" / "last.pt")
    assert not any(key.startswith(("_orig_mod.", "module.")) for key in state["model"])


def test_live_world_size_1_to_2_to_1_continues_the_run(tmp_path):
    """Each relaunch resumes with the configuration of its checkpoint: the total of steps changed live at step 2
    holds (the ranks were started with the first total, 8, and stopped there)."""
    run = tmp_path / "run"
    code = headless(run, f"{TINY}:workload", "--steps", "8", "--checkpoint-every", "0", "--at", "2:steps=10",
                    "--at", "4:world_size=2", "--at", "4:clip=0.5", "--at", "8:world_size=1", "--at", "9:accum=2")
    assert code == EXIT_OK
    metrics, events = read_jsonl(run / "metrics.jsonl"), read_jsonl(run / "events.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, 11))
    assert [m["world_size"] for m in metrics] == [1, 1, 1, 2, 2, 2, 2, 1, 1, 1]
    assert [m["clip"] for m in metrics][2:4] == [None, 0.5] and metrics[8]["accum"] == 2  # scripted once each
    changes = [(e["step"], e["option"], e["value"], e["previous"]) for e in events if e["event"] == "option_applied"]
    assert changes == [(2, "steps", 10, 8), (4, "clip", 0.5, None), (4, "world_size", 2, 1), (8, "world_size", 1, 2), (9, "accum", 2, 1)]
    relaunch_checkpoints = [e["step"] for e in events if e["event"] == "checkpoint" and e["reason"] == "world_size"]
    assert relaunch_checkpoints == [3, 7]
    assert [e["step"] for e in events if e["event"] == "resumed_from_checkpoint"] == [3, 7]
    assert [(e["step"], e["previous"], e["world_size"]) for e in events if e["event"] == "relaunching"] == [(3, 1, 2), (7, 2, 1)]
    elapsed = [m["elapsed_s"] for m in metrics]
    assert elapsed == sorted(elapsed), "training time carries across relaunches instead of restarting at 0"
    assert events[-1]["event"] == "run_ended" and events[-1]["status"] == "finished"
    assert not any(alive(pid) for pid in rank_pids(events))


def test_data_parallel_gradient_norms_equal_the_single_process_ones(tmp_path):
    """Same global batch, averaged gradients: the same norms, per module and in total (and the same loss, and the same
    update ratios), with each
    rank's batch split in pieces too (their gradients averaged across ranks once, on the step's last backward)."""
    settings = ["--steps", "4", "--accum", "2", "--probe-every", "1", "--checkpoint-every", "0"]
    assert headless(tmp_path / "ddp", f"{TINY}:without_dropout", "--world-size", "2", "--split", "3", *settings) == EXIT_OK
    parallel = read_jsonl(tmp_path / "ddp" / "metrics.jsonl")
    single, seen = make_trainer(f"{TINY}:without_dropout", steps=4, probe_every=1, options={"accum": "2"})
    single.run()
    assert len(parallel) == len(seen.metrics) == 4 and {row["split"] for row in parallel} == {3}
    for ours, theirs in zip(parallel, seen.metrics):
        assert ours["loss"] == pytest.approx(theirs.loss, rel=1e-5)
        assert ours["grad_norm_total"] == pytest.approx(theirs.grad_norm_total, rel=1e-5)
        assert ours["grad_norms"] == pytest.approx(theirs.grad_norms, rel=1e-4)
        assert ours["update_ratios"] == pytest.approx(theirs.update_ratios, rel=1e-4)  # rank 0's: the ranks' weights are one


@pytest.fixture(scope="module")
def single_process_spike_losses() -> list[float]:
    """The losses of one process on the spiking workload with the guard rolling back: DDP's and FSDP's reference."""
    single, seen = make_trainer(f"{TINY}:spike_at_step_21", steps=30, seed=3, options={"spike_guard": "rollback"})
    single.run()
    return [row.loss for row in seen.metrics]


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_a_spike_rolls_every_rank_back_at_the_same_step_as_one_process_would(tmp_path, parallel,
                                                                             single_process_spike_losses):
    """Step 21's batch times 1e4 on both ranks' halves: each judges the same loss (their mean) and the same norm (of
    the averaged gradients), rolls back to step 10 and trains on with the single process's losses. Sharded, each
    rank's host copies hold its shards, made DTensors again on the way back (core/engine/host_copy.py)."""
    settings = ["--steps", "30", "--seed", "3", "--checkpoint-every", "0", "--spike-guard", "rollback", "--parallel", parallel]
    assert headless(tmp_path / "ddp", f"{TINY}:spike_at_step_21", "--world-size", "2", *settings) == EXIT_OK
    events = read_jsonl(tmp_path / "ddp" / "events.jsonl")
    assert [(e["step"], e["rolled_back_to"]) for e in events if e["event"] == "spike_guarded"] == [(21, 10)]
    parallel = read_jsonl(tmp_path / "ddp" / "metrics.jsonl")
    assert [row["loss"] for row in parallel] == pytest.approx(single_process_spike_losses, rel=1e-4)


def test_an_out_of_memory_on_one_rank_starts_the_ranks_again_from_the_checkpoint_one_rung_down(tmp_path):
    """Rank 1's step 5 runs out of memory (8 samples a rank; 4 fit): the other rank waits in the step's collectives,
    so the supervisor starts both again from step 3's checkpoint with split = 2, the first split the run's forecaster
    predicts to fit a rank (asked while the ranks are down); step 4's row, trained again, is moved aside, and the
    run's losses are the single process's without the limit."""
    run = tmp_path / "run"
    assert headless(run, f"{TINY}:rank_1_out_of_memory_above_4_from_step_5", "--world-size", "2", "--steps", "8",
                    "--checkpoint-every", "3", "--seed", "4") == EXIT_OK
    events = read_jsonl(run / "events.jsonl")
    [rescued] = [e for e in events if e["event"] == "oom_rescued"]
    assert (rescued["step"], rescued["option"], rescued["value"], rescued["previous"]) == (5, "split", 2, 1)
    said, _, predicted = rescued["note"].partition("; ")
    assert said == ("on rank 1 of 2: the ranks start again from the checkpoint of step 3 (step 4 trains again), with "
                    "the options in force at step 5")
    assert re.fullmatch(r"predicted peak [0-9.]+ KiB of the [0-9.]+ GiB each of 2 ranks has", predicted), predicted
    assert [e["settings"]["split"] for e in events if e["event"] == "memory_predicted"] == [2]
    assert not forecasters_of(run)
    assert [e["step"] for e in events if e["event"] == "metrics_moved_aside"] == [3]
    rows = read_jsonl(run / "metrics.jsonl")
    assert [row["step"] for row in rows] == list(range(1, 9)) and [row["split"] for row in rows] == [1] * 3 + [2] * 5
    plain, seen = make_trainer(f"{TINY}:without_dropout", steps=8, seed=4)
    plain.run()
    assert [row["loss"] for row in rows] == pytest.approx([row.loss for row in seen.metrics], rel=1e-5)
    assert events[-1]["event"] == "run_ended" and events[-1]["status"] == "finished"


@pytest.mark.parametrize("factory, message", [
    ("rank_1_raises_at_step_4", "rank 1 failed: RuntimeError: simulated failure on one rank"),
    ("rank_1_killed_at_step_4", "rank 1 was killed by signal 9 (SIGKILL)"),
])
def test_a_rank_that_dies_stops_the_run_cleanly(tmp_path, factory, message):
    run = tmp_path / "run"
    assert headless(run, f"{TINY}:{factory}", "--world-size", "2", "--steps", "10", "--checkpoint-every", "2") == EXIT_FAILED
    events = read_jsonl(run / "events.jsonl")
    [error] = [e for e in events if e["event"] == "error"]
    assert message in error["message"] and error["rank"] == 1 and error["step"] == 4
    if "raises" in factory:
        assert "tiny.py" in error["traceback"]
    assert not any(alive(pid) for pid in rank_pids(events))
    assert load_checkpoint(run / "checkpoints" / "last.pt")["step"] == 2  # the last checkpoint is intact
    assert not list((run / "checkpoints").glob(".*tmp*"))


def test_world_sizes_this_machine_or_batch_cannot_have_are_refused(tmp_path, capsys):
    too_many = usable_cpus() + 1
    assert headless(tmp_path / "a", f"{TINY}:workload", "--world-size", str(too_many), "--batch-size", str(4 * too_many)) == EXIT_USAGE
    assert f"world_size (--world-size) {too_many}: {too_many} ranks on the CPU need {too_many} cores" in capsys.readouterr().err
    assert headless(tmp_path / "b", f"{TINY}:workload", "--steps", "4", "--at", "2:world_size=3",
                    "--at", f"3:world_size={too_many}") == EXIT_OK
    refused = {e["step"]: e["reason"] for e in read_jsonl(tmp_path / "b" / "events.jsonl") if e["event"] == "option_refused"}
    assert "world size 3 does not divide the batch of 16" in refused[2]
    assert f"{too_many} ranks on the CPU need {too_many} cores" in refused[3] or "does not divide" in refused[3]


def test_the_app_changes_the_world_size_and_the_trainer_stays_its_endpoint(tmp_path):
    link = ProcessLink(tmp_path / "run", [f"{TINY}:workload", "--steps", "100000", "--checkpoint-every", "0"])
    link.start()
    try:
        seen = Collected(link)
        seen.until(lambda m: isinstance(m, p.Metrics) and m.rows[-1].step >= 2)
        link.send(p.SetCommand(option="world_size", value=2))
        relaunching = seen.until(lambda m: isinstance(m, p.State) and m.state == "relaunching")
        assert relaunching.detail == "1 → 2"
        ack = seen.until(lambda m: isinstance(m, p.OptionApplied) and m.option == "world_size")
        assert (ack.value, ack.previous, ack.source) == (2, 1, "app")
        ranks = seen.until(lambda m: isinstance(m, p.Ranks))
        assert [r.rank for r in ranks.ranks] == [0, 1] and ranks.step >= ack.step
        link.send(p.PauseCommand())  # every rank waits at the boundary; rank 0 keeps them in step
        paused = seen.until(lambda m: isinstance(m, p.State) and m.state == "paused")
        link.send(p.ResumeCommand())
        seen.until(lambda m: isinstance(m, p.Metrics) and m.rows[-1].step > paused.step + 1)
        # Paused, and the ranks relaunched at that boundary (to shard the model): the new ranks start paused. Found by
        # the combination matrix: the pause reached the new rank 0 over its channel after its first step had begun.
        before = len(seen.messages)
        link.send(p.PauseCommand())
        link.send(p.SetCommand(option="parallel", value="fsdp"))

        def states_since() -> list[p.State]:
            return [m for m in seen.messages[before:] if isinstance(m, p.State)]

        def paused_after_the_relaunch() -> bool:
            states = [m.state for m in states_since()]
            return "relaunching" in states and "paused" in states[states.index("relaunching"):]

        seen.until(lambda m: isinstance(m, p.OptionApplied) and m.option == "parallel" and paused_after_the_relaunch())
        at = [m for m in states_since() if m.state == "paused"][-1]
        relaunched = [m for m in states_since() if m.state == "relaunching"][-1]
        assert at.step == relaunched.step  # before the new ranks' first step, not at a later boundary
        assert not [m for m in seen.messages[before:] if isinstance(m, p.Metrics) and m.rows[-1].step > at.step]
        link.send(p.ResumeCommand())
        seen.until(lambda m: isinstance(m, p.Metrics) and m.rows[-1].step > at.step + 1)
    finally:
        assert link.close(grace_s=60) == 0
    events = read_jsonl(tmp_path / "run" / "events.jsonl")
    assert events[-1]["event"] == "run_ended" and events[-1]["status"] == "stopped"
    assert (tmp_path / "run" / "trainer.log").stat().st_mode & 0o777 == 0o600  # the app writes it: private too
    assert any(e["event"] == "checkpoint" and e["reason"] == "final" for e in events)
    assert not any(alive(pid) for pid in rank_pids(events))


def listening_sockets(pid: int) -> list[tuple[int, str, int]]:
    """(pid, address, port) of every TCP socket that listens in ``pid``'s process tree."""
    root = psutil.Process(pid)
    found = []
    for process in [root, *root.children(recursive=True)]:
        try:
            found += [(process.pid, c.laddr.ip, c.laddr.port) for c in process.net_connections("inet") if c.status == psutil.CONN_LISTEN]
        except psutil.NoSuchProcess:
            continue
    return found


def test_a_world_size_2_run_listens_on_the_loopback_address_only(tmp_path):
    """Issue 12: torchrun's standalone rendezvous listened on every interface (``*:<port>``, twice), with no
    authentication. The supervisor's store and each rank's gloo sockets listen on 127.0.0.1 only."""
    run = tmp_path / "run"
    command = [sys.executable, "-m", "torchlab.core.launch.cli", f"{TINY}:workload", "--headless", "--world-size", "2",
               "--steps", "1000000", "--checkpoint-every", "0", "--run-dir", str(run), "--telemetry-interval", "0"]
    headless_run = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (run / "metrics.jsonl").exists() or '"ranks"' not in (run / "metrics.jsonl").read_text():
            assert headless_run.poll() is None, headless_run.stderr.read()
            assert time.monotonic() < deadline, "the ranks never reported"
            time.sleep(0.1)
        listening = listening_sockets(headless_run.pid)
        rank_processes = {pid for pid in rank_pids(read_jsonl(run / "events.jsonl"))}
        assert any(pid == headless_run.pid for pid, _, _ in listening), "the supervisor's store was not found"
        assert rank_processes <= {pid for pid, _, _ in listening}, "each rank listens for its gloo peers"
        assert {address for _, address, _ in listening} == {"127.0.0.1"}, listening
        assert (run / "ranks").stat().st_mode & 0o777 == 0o700, "the ranks' logs are as private as the run"
    finally:
        headless_run.send_signal(signal.SIGINT)  # stop at a step boundary, as Ctrl-C does
        assert headless_run.wait(120) == EXIT_INTERRUPTED  # after a final checkpoint


def test_the_worker_under_torchrun_serves_the_app_from_rank_0(tmp_path):
    socket_path, token_file = tmp_path / "w.sock", tmp_path / "token"
    token = secrets.token_hex(16)
    token_file.write_text(token)
    token_file.chmod(0o600)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "-m", "torchlab.core.launch.worker", "--run-dir", str(tmp_path / "run"), "--socket", str(socket_path),
               "--token-file", str(token_file), "--", f"{TINY}:workload", "--steps", "100000", "--checkpoint-every", "0"]
    torchrun = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        client = connect(socket_path, token)
        welcome = next(client)
        assert isinstance(welcome, p.Welcome) and welcome.run.world_size == 2 and len(welcome.run.ranks) == 2
        assert next(m for m in client if isinstance(m, p.Ranks)).ranks[1].rank == 1
        client.send(p.SetCommand(option="world_size", value=1))
        refusal = next(m for m in client if isinstance(m, p.OptionRefused))
        assert "started by torchrun, which fixes their number" in refusal.reason
        client.send(p.StopCommand())
        state = next(m for m in client if isinstance(m, p.State) and m.state == "stopped")
        assert state.step > 0
        assert torchrun.wait(120) == 0
    finally:
        if torchrun.poll() is None:
            torchrun.kill()
    events = read_jsonl(tmp_path / "run" / "events.jsonl")
    assert any(e["event"] == "checkpoint" and e["reason"] == "final" for e in events)
    assert not any(alive(pid) for pid in rank_pids(events))


class connect:
    """A raw protocol client: iterate to read messages (deadline per message), ``send`` commands."""

    def __init__(self, path: Path, token: str, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                self.socket.connect(str(path))
                break
            except (FileNotFoundError, ConnectionRefusedError):
                self.socket.close()
                assert time.monotonic() < deadline, "the worker never served its socket"
                time.sleep(0.1)
        self.socket.settimeout(timeout)
        self.reader = self.socket.makefile("rb")
        self.send(p.Hello(version=p.PROTOCOL_VERSION, token=token))

    def send(self, message: p.Message) -> None:
        self.socket.sendall(message.encode())

    def __iter__(self):
        return self

    def __next__(self) -> p.Message:
        line = self.reader.readline()
        if not line:
            raise AssertionError("the worker closed the connection")
        return p.decode(line)


@pytest.mark.gpu
def test_nccl_through_the_launcher_on_one_gpu(tmp_path):
    """torchrun with one process is still a rank: an nccl process group, DDP, and the per-step collectives."""
    run = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
         "-m", "torchlab.core.launch.cli", f"{TINY}:workload", "--headless", "--device", "cuda", "--steps", "6",
         "--run-dir", str(run), "--at", "3:amp=fp16", "--at", "4:checkpointing=on", "--at", "5:world_size=2"],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == EXIT_OK, done.stderr[-3000:]
    metrics, events = read_jsonl(run / "metrics.jsonl"), read_jsonl(run / "events.jsonl")
    [started] = [e for e in events if e["event"] == "run_started"]
    assert started["ranks"][0]["device"] == "cuda:0" and started["world_size"] == 1
    assert [m["step"] for m in metrics] == list(range(1, 7)) and metrics[2]["amp"] == "fp16"
    assert metrics[0]["ranks"][0]["allocated_bytes"] > 0
    [refusal] = [e for e in events if e["event"] == "option_refused"]
    assert "started by torchrun, which fixes their number" in refusal["reason"]


@pytest.mark.gpu
def test_more_ranks_than_gpus_are_refused():
    from torchlab.core.engine.parallel.distributed import check_world_size
    from torchlab.core.options import OptionChangeError

    gpus = torch.cuda.device_count()
    with pytest.raises(OptionChangeError, match=f"{gpus + 1} ranks need {gpus + 1} GPUs, one each; this machine has {gpus}"):
        check_world_size(gpus + 1, device=torch.device("cuda"), batch_size=16 * (gpus + 1))


#: The trial tests' run: rank 1 runs out of memory only under bf16, which the run without a trial never has.
TRIAL_RUN = [f"{TINY}:rank_1_out_of_memory_under_bf16", "--world-size", "2", "--steps", "8", "--checkpoint-every", "0",
             "--seed", "4"]


@pytest.fixture(scope="module")
def without_a_trial(tmp_path_factory) -> list[dict]:
    """The rows of ``TRIAL_RUN`` with no trial: what each trial test's run must train as (made once, two ranks)."""
    run = tmp_path_factory.mktemp("plain") / "run"
    assert headless(run, *TRIAL_RUN) == EXIT_OK
    return read_jsonl(run / "metrics.jsonl")


def test_every_rank_runs_a_trial_and_the_run_goes_on_as_without_it(tmp_path, without_a_trial):
    """With two ranks the trial's arms run on both (their gradients are averaged step by step), and the
    run's losses after it are those of the same run without it."""
    assert headless(tmp_path / "tried", *TRIAL_RUN, "--trial", "5:clip=0.5", "--trial-steps", "3") == EXIT_OK
    [trial] = read_jsonl(tmp_path / "tried" / "trials.jsonl")
    assert trial["error"] is None and [len(arm["losses"]) for arm in trial["arms"]] == [3, 3]
    tried = read_jsonl(tmp_path / "tried" / "metrics.jsonl")
    assert [row["loss"] for row in tried] == [row["loss"] for row in without_a_trial]


def test_an_arm_out_of_memory_on_one_rank_stops_the_run_saved_before_the_trial_instead_of_hanging(
        tmp_path, capsys, without_a_trial):
    """Rank 1 alone runs out of memory in the changed arm: the others are inside the step's collectives, so
    the run stops with a reason (never a hang, never ranks whose steps pair up with the wrong ones), from a
    checkpoint taken before the trial; the resumed run trains on as the run without the trial."""
    run = tmp_path / "run"
    assert headless(run, *TRIAL_RUN, "--trial", "5:amp=bf16", "--trial-steps", "3") == EXIT_FAILED
    events = read_jsonl(run / "events.jsonl")
    [error] = [e for e in events if e["event"] == "error"]
    assert error["rank"] == 1 and "out of memory in a trial's arm 'amp=bf16' at its step 1 of 3" in error["message"]
    assert "It was saved at step 4, before the trial" in error["message"]
    assert not any(alive(pid) for pid in rank_pids(events))
    assert load_checkpoint(run / "checkpoints" / "last.pt")["step"] == 4
    assert "at its step 1 of 3 ([enforce fail at alloc_cpu.cpp" in capsys.readouterr().err  # printed as it is, not as markup
    assert main(["--resume", str(run), "--headless", "--telemetry-interval", "0"]) == EXIT_OK
    resumed = read_jsonl(run / "metrics.jsonl")
    assert [row["loss"] for row in resumed] == [row["loss"] for row in without_a_trial]

def test_the_workloads_metrics_are_the_mean_over_ranks_in_the_steps_one_all_reduce(tmp_path):
    run = tmp_path / "run"
    workload = f"{WORKLOADS / 'own_training.py'}:rank_accuracy"
    assert headless(run, workload, "--world-size", "2", "--steps", "4", "--checkpoint-every", "0", "--eval-every", "0") == EXIT_OK
    rows = read_jsonl(run / "metrics.jsonl")
    assert [row["metrics"]["rank"] for row in rows] == [0.5] * 4  # ranks 0 and 1
    assert set(rows[0]["lrs"]) == {"body", "head"}


def test_a_resume_whose_flag_every_rank_refuses_says_why_as_a_new_run_would(tmp_path, capsys):
    """Found by the combination matrix (the error screen's restart with pin_memory on, on a CPU): each rank refused
    the flag at its start, rank 1's exit reached the launcher before rank 0's report, and the run ended with "rank 1
    failed: exited with code 2", exit 1, the paragraph lost."""
    run = tmp_path / "run"
    assert headless(run, f"{TINY}:workload", "--world-size", "2", "--steps", "2", "--checkpoint-every", "2",
                    "--eval-every", "0") == EXIT_OK
    capsys.readouterr()
    assert main(["--resume", str(run), "--pin-memory", "--steps", "4", "--headless"]) == EXIT_USAGE
    said = capsys.readouterr().err
    assert "pin_memory (--pin-memory) on: pinned memory speeds up copies" in said and "exited with code" not in said
