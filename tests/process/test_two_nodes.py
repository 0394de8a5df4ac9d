"""Two nodes on one machine, as docs/ranks.md runs several: two ``torchrun`` agents (``--nnodes 2``, a c10d rendezvous on
127.0.0.1, gloo), the trainer that serves the app on rank 0's node; a change typed live, a scheduler's warning
(SIGTERM) to rank 1 that stops both ranks at one step with one checkpoint, and the resume on two nodes, bit for bit
the run that was never stopped."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
from pathlib import Path

from test_ranks import TINY, connect, read_jsonl
from torchlab.core.errors import EXIT_OK
from torchlab.core.wire import protocol as p

STEPS = 600


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def two_nodes(port: int, logs: Path, *command: str) -> list[subprocess.Popen]:
    """One torchrun agent a node, one rank each, as docs/ranks.md starts them (the rendezvous on node 0's address).
    Each agent writes to a file, never a pipe: a pipe nobody reads until the end fills, and the agent (or its rank,
    which shares its output) blocks on a write and never ends."""
    logs.mkdir()
    agents = []
    for node in (0, 1):
        with (logs / f"node-{node}.log").open("w") as log:
            agents.append(subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                 "--node-rank", str(node), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                 "--rdzv-conf", f"is_host={node == 0}", "--max-restarts", "0", *command],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    return agents


def told(logs: Path) -> str:
    """The last of what each agent printed, for an assertion's message."""
    return "\n".join(f"--- node {node}:\n" + (logs / f"node-{node}.log").read_text()[-2500:] for node in (0, 1))


def ended(agents: list[subprocess.Popen], logs: Path) -> list[int]:
    try:
        return [agent.wait(180) for agent in agents]
    except subprocess.TimeoutExpired:
        raise AssertionError(f"an agent did not end:\n{told(logs)}") from None
    finally:
        for agent in agents:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)


def losses(run: Path) -> dict[int, float]:
    return {row["step"]: row["loss"] for row in read_jsonl(run / "metrics.jsonl")}


def test_two_nodes_take_a_live_change_stop_together_on_a_signal_to_one_rank_and_resume_bit_for_bit(tmp_path):
    run, socket_path, token_file = tmp_path / "run", tmp_path / "w.sock", tmp_path / "token"
    token = secrets.token_hex(16)
    token_file.write_text(token)
    token_file.chmod(0o600)
    training = [f"{TINY}:workload", "--steps", str(STEPS), "--checkpoint-every", "0", "--telemetry-interval", "0"]
    agents = two_nodes(free_port(), tmp_path / "first", "-m", "torchlab.core.launch.worker", "--run-dir", str(run), "--socket",
                       str(socket_path), "--token-file", str(token_file), "--", *training)
    try:
        client = connect(socket_path, token)
        welcome = next(client)
        assert isinstance(welcome, p.Welcome) and welcome.run.world_size == 2
        assert sorted(rank.node for rank in welcome.run.ranks) == [0, 1]  # one rank a node, the nodes told apart
        client.send(p.SetCommand(option="lr_scale", value=0.5))
        changed = next(m for m in client if isinstance(m, p.OptionApplied)).step
        client.send(p.PauseCommand())
        paused = next(m for m in client if isinstance(m, p.State) and m.state == "paused").step
        [rank_1] = [rank.pid for rank in welcome.run.ranks if rank.rank == 1]
        os.kill(rank_1, signal.SIGTERM)  # a scheduler's warning, to the other node's rank only
        stopped = next(m for m in client if isinstance(m, p.State) and m.state == "stopped").step
    finally:
        codes = ended(agents, tmp_path / "first")
    assert codes == [EXIT_OK, EXIT_OK], told(tmp_path / "first")
    assert changed <= paused == stopped < STEPS
    events = read_jsonl(run / "events.jsonl")
    [request] = [e for e in events if e["event"] == "stop_requested"]
    assert request["reason"] == "SIGTERM to rank 1: every rank stops"
    finals = [e for e in events if e["event"] == "checkpoint" and e["reason"] == "final"]
    assert [e["step"] for e in finals] == [stopped]  # one checkpoint, both ranks at the same step

    # the resume, on two nodes again, given no flag but --resume: to the run's end
    resumed = two_nodes(free_port(), tmp_path / "resumed", "-m", "torchlab.core.launch.cli", "--headless", "--resume", str(run))
    assert ended(resumed, tmp_path / "resumed") == [EXIT_OK, EXIT_OK], told(tmp_path / "resumed")
    straight = tmp_path / "straight"
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "torchlab.core.launch.cli", *training, "--headless", "--run-dir", str(straight),
                           "--at", f"{changed}:lr_scale=0.5"], capture_output=True, text=True, timeout=300)
    assert done.returncode == EXIT_OK, done.stderr[-3000:]
    assert losses(run) == losses(straight) and len(losses(run)) == STEPS
