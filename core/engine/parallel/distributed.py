"""Data parallelism inside a rank: the process group, the DDP wrapper, and the few collectives per step.

A rank process is started by PyTorch's elastic launcher (``torchrun``, or ``core/engine/ranks/supervisor.py`` which uses
the same machinery), which sets ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``; this module only reads
them, opens the process group (gloo on CPU, nccl on CUDA, one GPU per rank) and gives the trainer what
it needs to keep its ranks in lock-step:

- ``share`` (every step boundary): rank 0's commands, as one small JSON packet in a uint8 tensor, so every rank
  applies the same changes at the same step; and whether a signal asked any rank to stop (a scheduler's SIGTERM or
  SIGUSR1 reaches one rank, or all), so every rank stops at the same step. One collective, an all-reduce of the
  bytes' maximum (the others' packets are zeros but for their signal); nothing is unpickled (the packet is JSON).
- ``mean_loss`` (every step): the global mean loss (and the workload's metrics), so every rank makes the same
  non-finite decision.
- ``gather_figures`` (report steps, at most once a second; rank 0 decides and says so in the boundary
  packet): each rank's step time, data wait, allocator memory and RSS, so a straggler is visible.

Rank 0 is the only rank that reports; gradients are read after backward, when DDP has averaged them,
so rank 0's gradient norms are the global ones.
"""

from __future__ import annotations

import json
import os
import random
import socket
from dataclasses import dataclass
from typing import Any

import psutil
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from torchlab.core.wire import strict_json
from torchlab.core.engine.parallel.loopback_rendezvous import keep_ranks_on_loopback
from torchlab.core.cpu_share import WAIT_POLICY_VARIABLE
from torchlab.core.options import OptionChangeError, usable_cpus
from torchlab.core.wire.payloads import RankFigures

#: The module a supervised rank runs (``python -m``): how the supervisor and the telemetry tell a rank's process.
RANK_MODULE = "torchlab.core.engine.ranks.rank_process"
#: The phases each rank's figures carry (RankFigures' ``copy_s`` to ``communication_s``, in that order).
GATHERED_PHASES = ("copy", "forward", "backward", "optimizer", "communication")
#: Bytes of one boundary packet: a length prefix and the JSON of the commands (a handful of small objects), then the
#: signal's bytes (``SIGNAL_BYTES``): the number of a signal that asked a rank to stop, and that rank + 1 (up to 255).
PACKET_BYTES = 1024
SIGNAL_BYTES = 2


@dataclass(frozen=True)
class RankContext:
    """Who this process is among the ranks. ``supervised``: launched by torchlab's supervisor (which can
    relaunch with another world size); otherwise by ``torchrun``, which fixes the world size."""

    rank: int
    world_size: int
    local_rank: int
    supervised: bool

    @property
    def reports(self) -> bool:
        return self.rank == 0


def rank_from_environment(*, supervised: bool) -> RankContext | None:
    """The rank the elastic launcher gave this process, or None when no launcher started it."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    return RankContext(
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        supervised=supervised,
    )


def rank_device(requested: str, context: RankContext) -> str:
    """One GPU per rank (``cuda:LOCAL_RANK``) when training on CUDA; the CPU otherwise."""
    wants_cuda = requested.startswith("cuda") or (requested == "auto" and torch.cuda.is_available())
    return f"cuda:{context.local_rank}" if wants_cuda else "cpu"


def open_process_group(context: RankContext, device: torch.device) -> None:
    """Join the launcher's rendezvous (``env://``): gloo on CPU, nccl on CUDA. A rank the supervisor
    started (one machine) keeps its sockets on the loopback interface."""
    if dist.is_initialized():
        return
    if context.supervised:
        keep_ranks_on_loopback()
    if device.type == "cuda":
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group("gloo")


def check_world_size(world_size: int, *, device: torch.device, batch_size: int) -> None:
    """Refuse a world size this machine or this run cannot have, saying why."""
    if batch_size % world_size:
        raise OptionChangeError(
            f"world size {world_size} does not divide the batch of {batch_size} (the global batch stays "
            f"{batch_size} and each rank takes an equal share): choose a divisor of {batch_size}"
        )
    if device.type == "cuda":
        gpus = torch.cuda.device_count()
        if world_size > gpus:
            raise OptionChangeError(f"{world_size} ranks need {world_size} GPUs, one each; this machine has {gpus}")
    else:
        cpus = usable_cpus()
        if world_size > cpus:
            raise OptionChangeError(
                f"{world_size} ranks on the CPU need {world_size} cores, one each; this run may use {cpus}"
            )


class ForwardingDDP(DistributedDataParallel):
    """DistributedDataParallel that lets ``loss_fn`` read the model's own attributes (``model.config``).

    Calls must still go through ``model(...)``: that is what makes DDP average the gradients.
    """

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            inner = self.__dict__.get("_modules", {}).get("module")
            if name == "module" or inner is None:
                raise
            return getattr(inner, name)


def wrap_model(model: torch.nn.Module, device: torch.device) -> DistributedDataParallel:
    """DDP around the (already placed, already optimizer-bound) model; rank 0's weights are broadcast.

    ``static_graph`` stays off: activation checkpointing is switched on and off in place while the
    run trains, which changes the autograd graph between steps.
    """
    if device.type == "cuda":
        return ForwardingDDP(model, device_ids=[device.index], output_device=device.index)
    return ForwardingDDP(model)


class Collectives:
    """The per-step collectives of one rank. Every rank calls each method at the same point."""

    def __init__(self, context: RankContext, device: torch.device) -> None:
        self.context = context
        self.device = device
        # nccl moves only device tensors; gloo only host ones.
        self._wire = device if device.type == "cuda" else torch.device("cpu")
        self._packet = torch.zeros(PACKET_BYTES, dtype=torch.uint8, device=self._wire)
        self._process = psutil.Process()
        #: the rank's hang watch (hang_watch.py), which numbers the collectives below as each rank enters and completes them
        self.hang_watch: Any = None
        self._cpu_times: tuple[float, float] | None = None  # the machine's CPU times when its figures were last gathered

    def _entering(self, op: str) -> None:
        if self.hang_watch is not None:
            self.hang_watch.enter(op)

    def _completed(self) -> None:
        if self.hang_watch is not None:
            self.hang_watch.complete()

    # ---- the step boundary
    def share(self, payload: dict[str, Any] | None, signalled: int = 0) -> dict[str, Any]:
        """Rank 0 passes its payload (JSON-able, encoded within PACKET_BYTES); every rank gets it back, with
        ``signalled``: the highest signal number a rank gave (0: none asked any rank to stop), and ``signalled_rank``:
        the highest rank that gave one (None where none did, or past rank 254). Every rank's bytes are reduced to
        their maximum: rank 0's packet, each rank's signal at the end."""
        data = bytearray(PACKET_BYTES)
        if self.context.rank == 0:
            body = encode_packet(payload or {})
            data[: len(body)] = body
        if signalled:
            data[-SIGNAL_BYTES:] = bytes([min(signalled, 255), min(self.context.rank + 1, 255)])
        self._packet.copy_(torch.frombuffer(data, dtype=torch.uint8))
        self._entering("the boundary's commands")
        dist.all_reduce(self._packet, op=dist.ReduceOp.MAX)
        self._completed()
        received = self._packet.cpu().numpy().tobytes()
        signal_number, rank = received[-SIGNAL_BYTES], received[-1] - 1
        return {**decode_packet(received[:-SIGNAL_BYTES]), "signalled": signal_number,
                "signalled_rank": rank if signal_number and 0 <= rank < 254 else None}

    def describe_ranks(self) -> list[dict[str, Any]]:
        """Each rank's host, node (torchrun's ``GROUP_RANK``), pid, device and CPU threads (as torch runs, and how its OpenMP threads wait: the share
        core/engine/parallel/cpu_share.py applied), gathered once at start (for run_started)."""
        mine = {"rank": self.context.rank, "host": socket.gethostname(), "node": int(os.environ.get("GROUP_RANK", "0")),
                "pid": os.getpid(), "device": str(self.device),
                "threads": torch.get_num_threads(), "omp_wait_policy": os.environ.get(WAIT_POLICY_VARIABLE)}
        everyone: list[Any] = [None] * self.context.world_size
        dist.all_gather_object(everyone, mine)
        return everyone

    # ---- every step
    def mean_loss(self, loss: torch.Tensor, metrics: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The mean over ranks of ``loss`` (each rank's mean over an equal share of the global batch) and of the
        workload's ``metrics`` vector, in one all-reduce."""
        parts = [loss.detach().float().reshape(1)] + ([metrics.float()] if metrics is not None else [])
        reduced = torch.cat(parts) if len(parts) > 1 else parts[0].clone()
        self._entering("the loss's mean")
        dist.all_reduce(reduced, op=dist.ReduceOp.SUM)
        self._completed()
        reduced = reduced / self.context.world_size
        return reduced[0], (reduced[1:] if metrics is not None else None)

    def total(self, count: torch.Tensor) -> torch.Tensor:
        """The sum over ranks of a count (a step's loss items, Workload.loss_items), in one all-reduce."""
        summed = count.detach().float().reshape(1).clone()
        self._entering("the loss items' count")
        dist.all_reduce(summed, op=dist.ReduceOp.SUM)
        self._completed()
        return summed[0]

    # ---- report steps
    def gather_figures(self, step_time_s: float, data_wait_s: float, phases: dict[str, float] | None) -> list[RankFigures]:
        """Every rank's figures, in rank order; rank 0 uses them, the others discard them. A figure a rank
        could not measure (the allocator's on a CPU rank, a phase of no timed step) travels as NaN in the gathered
        tensor, and is None. ``phases``: the means by phase since the last gather (PhaseTotals.since_gathered)."""
        if self.device.type == "cuda":
            memory = [float(torch.cuda.memory_allocated(self.device)), float(torch.cuda.memory_reserved(self.device)),
                      float(torch.cuda.max_memory_allocated(self.device))]
        else:
            memory = [float("nan")] * 3
        try:
            rss = float(self._process.memory_info().rss)
        except psutil.Error:
            rss = float("nan")
        timed = [(phases or {}).get(name, float("nan")) for name in GATHERED_PHASES]
        # In the order of RankFigures' fields after ``rank``.
        mine = torch.tensor([step_time_s, data_wait_s, *memory, rss, *timed, *self._host()], dtype=torch.float64,
                            device=self._wire)
        everyone = [torch.empty_like(mine) for _ in range(self.context.world_size)]
        self._entering("the ranks' figures")
        dist.all_gather(everyone, mine)
        self._completed()
        table = torch.stack(everyone).cpu().tolist()
        return [RankFigures(rank, *(None if value != value else value for value in row)) for rank, row in enumerate(table)]

    def _host(self) -> list[float]:
        """This rank's machine: its CPU's busy share since this rank last asked (0-100; NaN the first time) and its
        available memory. From the CPU's times, not ``psutil.cpu_percent``, whose one baseline a process shares with
        the telemetry sampler of a torchrun rank 0."""
        try:
            times, available = psutil.cpu_times(), float(psutil.virtual_memory().available)
        except (psutil.Error, OSError):
            return [float("nan")] * 2
        total, idle = sum(times), times.idle + getattr(times, "iowait", 0.0)
        busy = float("nan")
        if self._cpu_times is not None and total > self._cpu_times[0]:
            busy = 100.0 * (1 - (idle - self._cpu_times[1]) / (total - self._cpu_times[0]))
        self._cpu_times = (total, idle)
        return [busy, available]

    # ---- checkpoints
    def gather_objects(self, value: Any) -> list[Any]:
        """Every rank's ``value`` (RNG states at a checkpoint: rare, small). Uses torch's object collective
        between this run's own ranks; nothing from outside the process group is unpickled."""
        everyone: list[Any] = [None] * self.context.world_size
        dist.all_gather_object(everyone, value)
        return everyone


def packet_fits(payload: dict[str, Any]) -> bool:
    """Whether ``payload`` fits one boundary packet (its length prefix and JSON, before the signal's bytes)."""
    return len(strict_json.dumps(payload).encode("utf-8")) + 4 <= PACKET_BYTES - SIGNAL_BYTES


def encode_packet(payload: dict[str, Any]) -> bytes:
    body = strict_json.dumps(payload).encode("utf-8")
    if len(body) + 4 > PACKET_BYTES - SIGNAL_BYTES:
        raise ValueError(f"a boundary packet of {len(body)} bytes does not fit in {PACKET_BYTES - SIGNAL_BYTES}")
    return len(body).to_bytes(4, "little") + body


def decode_packet(data: bytes) -> dict[str, Any]:
    length = int.from_bytes(data[:4], "little")
    return json.loads(data[4 : 4 + length].decode("utf-8")) if length else {}


def seed_rank(seed: int, step: int, rank: int) -> None:
    """A fresh random stream for a rank that has no saved one (a new rank after a world-size change)."""
    derived = (seed * 1_000_003 + step * 1009 + rank) % (2**63)
    random.seed(derived)
    torch.manual_seed(derived)
    try:
        import numpy
    except ImportError:
        return
    numpy.random.seed(derived % (2**32))
