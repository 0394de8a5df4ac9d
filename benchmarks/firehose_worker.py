"""A synthetic trainer for benchmarks: the real socket, protocol and outbox, with metrics at a set rate.

Started by ``ProcessLink(worker_module="benchmarks.firehose_worker")`` in place of the real worker, it
speaks exactly what the app hears from a trainer, only faster than any model trains: ``--rate`` records
per second (0 = as fast as it can), in steps of ``--records-per-step``, with per-module gradient norms
for ``--modules`` modules every 100 steps, and an immediate acknowledgement of every ``set`` command.

    python -m benchmarks.firehose_worker --run-dir D --socket S --token-file T -- --rate 100000
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import threading
import time
from pathlib import Path

from torchlab.core.wire import protocol as p
from torchlab.core.wire.control_server import ControlServer
from torchlab.core.wire.metrics_row import MetricsRow
from torchlab.core.options import LiveOptions
from torchlab.core.wire.outbox import Outbox
from torchlab.core.wire.payloads import ModuleInfo, RunInfo


class Firehose:
    def __init__(self, modules: int) -> None:
        self.outbox = Outbox()
        self.step = 0
        self.modules = [ModuleInfo(f"blocks.{i // 4}.layer{i % 4}", 1024) for i in range(modules)]
        self.options = LiveOptions(pin_memory=False)
        self.sent = 0

    def welcome(self) -> p.Welcome:
        return p.Welcome(
            run=RunInfo(workload="firehose", run_dir="", device="cpu", steps=10**9, batch_size=1, pid=os.getpid(),
                        started=time.time(), checkpoint_blocks=[], world_size=1, ranks=[]),
            modules=self.modules, options=self.options.as_dict(), state="running", step=self.step,
        )

    def on_command(self, command: p.Message) -> None:
        if isinstance(command, p.SetCommand):
            previous = getattr(self.options, command.option, None)
            self.options = self.options.with_value(command.option, command.value)
            self.outbox.add_event(p.OptionApplied(
                option=command.option, value=command.value, previous=previous, step=self.step + 1, source="app"))
        elif isinstance(command, p.StopCommand):
            os._exit(0)

    def row(self) -> MetricsRow:
        self.step += 1
        loss = 4.0 * 0.9995 ** self.step + 0.05 * random.random()
        return MetricsRow(step=self.step, time=time.time(), elapsed_s=0.0, epoch=0, loss=loss, lr=1e-3, samples_per_s=1e5,
                          step_time_s=1e-5, grad_norm_total=1.0, clipped=None, grad_norms=None, skipped=False,
                          data_wait_s=0.0, options=self.options)

    def run(self, rate: float) -> None:
        started = time.perf_counter()
        while True:
            self.outbox.add_metrics(self.row())
            if self.step % 100 == 0:  # latest-wins anyway: the app sees at most one per drain
                self.outbox.add_latest(p.GradNorms(step=self.step, norms=[random.random() for _ in self.modules], total=1.0))
            self.sent += 1
            if rate > 0:
                ahead = self.sent / rate - (time.perf_counter() - started)
                if ahead > 0.002:
                    time.sleep(ahead)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--socket", type=Path, required=True)
    parser.add_argument("--token-file", type=Path, required=True)
    parser.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    options = argparse.ArgumentParser()
    options.add_argument("--rate", type=float, default=0)
    options.add_argument("--modules", type=int, default=64)
    settings, _ = options.parse_known_args([a for a in args.rest if a != "--"])
    firehose = Firehose(settings.modules)
    ControlServer(args.socket, args.token_file.read_text().strip(), firehose.outbox,
                  welcome=firehose.welcome, on_command=firehose.on_command, on_client_gone=lambda: os._exit(0))
    parent = os.getppid()
    threading.Thread(target=lambda: _exit_with_parent(parent), daemon=True).start()
    firehose.run(settings.rate)


def _exit_with_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.2)
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
