"""What numbering DDP's gradient all_reduce with a Python comm hook would cost a step, against torch's own count.

    .venv/bin/python -m benchmarks.gradient_sync_cost                 # 2 gloo ranks, 4 buckets, 400 steps each way
    .venv/bin/python -m benchmarks.gradient_sync_cost --buckets 16 --steps 300

The hang watch (core/engine/parallel/hang_watch.py) says how many collectives each rank issued, to name the rank the
others wait for. Two ways to count DDP's: a comm hook in Python around torch's own ``allreduce_hook`` that counts
each bucket (what a first version did), or c10d's own sequence number for the process group, read only when a hang is
explained (what the watch does). Two ranks (processes, gloo on 127.0.0.1) train three copies of one MLP, a step of
each in turn, the order rotated each round so that the machine's load falls on all alike: DDP as torch runs it (its
C++ all_reduce), DDP with torch's ``allreduce_hook`` (Python, nothing counted), and DDP with the counting hook.
``bucket_cap_mb`` makes the MLP's gradients ``--buckets`` buckets. Printed: each way's median step time (rank 0's,
after a warm-up), and what the hooks add, a step and a bucket.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WIDTH = 512
WARMUP = 20


def _rank(rank: int, port: int, buckets: int, steps: int, results: dict) -> None:
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    bucket_mb = WIDTH * (WIDTH + 1) * 4 / 2**20  # one layer's gradients a bucket

    def wrapped() -> DistributedDataParallel:
        layers = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(buckets)])
        return DistributedDataParallel(layers, bucket_cap_mb=bucket_mb)

    counted = [0, 0]

    def counting(state, bucket):  # unannotated: DDP checks a hook's annotations
        counted[0] += 1

        def completed(future):
            counted[1] += 1
            return future.value()

        return allreduce_hook(None, bucket).then(completed)

    ways = {"torch's C++": wrapped(), "allreduce_hook": wrapped(), "counting hook": wrapped()}
    ways["allreduce_hook"].register_comm_hook(None, allreduce_hook)
    ways["counting hook"].register_comm_hook(None, counting)
    batch = torch.randn(32, WIDTH)
    times: dict[str, list[float]] = {name: [] for name in ways}
    order = list(ways)
    for step in range(WARMUP + steps):
        for name in order[step % 3:] + order[:step % 3]:
            started = time.perf_counter()
            ways[name](batch).square().mean().backward()
            if step >= WARMUP:
                times[name].append(time.perf_counter() - started)
    if rank == 0:
        results.update({name: statistics.median(values) for name, values in times.items()})
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--buckets", type=int, default=4)
    parser.add_argument("--steps", type=int, default=400)
    args = parser.parse_args()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_rank, args=(port, args.buckets, args.steps, results), nprocs=2)
        plain = results["torch's C++"]
        said = [f"{name} {results[name] * 1e3:.3f} ms" + (
                f" ({(results[name] - plain) * 1e6:+.0f} us a step, {(results[name] - plain) * 1e6 / args.buckets:+.0f} "
                "us a bucket)" if name != "torch's C++" else "") for name in results]
        print(f"2 gloo ranks, {args.buckets} buckets, {args.steps} steps each way (median, rank 0): " + "; ".join(said))


if __name__ == "__main__":
    main()
