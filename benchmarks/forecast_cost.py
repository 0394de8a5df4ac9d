"""What the run's forecaster costs training while it predicts: steps with it busy beside them against steps with it
idle, on the same trainer, in alternating blocks.

    .venv/bin/python benchmarks/forecast_cost.py                        # resnet_small, 12 rounds of 40 steps
    .venv/bin/python benchmarks/forecast_cost.py --workload tiny_gpt --rounds 8

The forecaster is the app's (core/engine/forecast/forecaster_process.py: niced, one thread, the workload built
without its weights), started once. In a "busy" block it is kept predicting throughout: a new setting (another batch
size, so that nothing is answered from its cache) is asked each time one is answered, two outstanding; in an "idle"
block it waits on its stdin, as it does once a run's settings are predicted. The blocks alternate in a shuffled
order each round, so the machine's drift hits both alike. Printed: the median step time of each, their ratio, and
how long a prediction took beside training. The trainer takes the cores its share gives it (all of them in one
process): on a CPU box the forecaster's predictions compete with training for them, at a lower priority; on a GPU box
a step waits on the GPU and the forecaster runs on a core the step does not use.

A run pays this only while the forecaster predicts: the settings in force and those worth weighing once, a few
seconds (``FORECAST_AFTER_S`` into the run, or at F), then a few after each change of a setting that shapes memory.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WORKLOADS = {"resnet_small": f"{ROOT / 'benchmarks' / 'resnet_small.py'}:workload", "tiny_gpt": "tiny_gpt"}


class BusyForecaster:
    """The forecaster process, kept predicting while ``busy`` (two settings outstanding), idle otherwise."""

    def __init__(self, config) -> None:
        from torchlab.core.engine.forecast.forecaster import FORECASTER_MODULE

        self.process = subprocess.Popen([sys.executable, "-m", FORECASTER_MODULE], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.process.stdin.write(json.dumps({"config": config.to_toml(), "explicit": []}) + "\n")
        self.process.stdin.flush()
        self.busy = False
        self.batch = 8
        self.sent = 0
        self.answered = 0
        self.seconds: list[float] = []  # what each prediction took, by the forecaster's own clock
        self._lock = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _ask(self) -> None:
        from torchlab.core.engine.forecast.step_shape import StepShape

        self.batch += 1
        request = {"settings": dataclasses.asdict(StepShape(batch_size=self.batch)), "change": f"batch_size={self.batch}",
                   "step": 0, "held_bytes": 0, "ratio": None}
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        self.sent += 1

    def _read(self) -> None:
        from torchlab.core.wire.codec import decode

        for line in self.process.stdout:
            answer = decode(line)
            with self._lock:
                self.answered += 1
                if answer.prediction is not None:
                    self.seconds.append(answer.prediction.seconds)
                if self.busy:
                    self._ask()
                self._lock.notify_all()

    def start_predicting(self) -> None:
        with self._lock:
            self.busy = True
            self._ask()
            self._ask()

    def stop_predicting(self) -> None:
        """Ask nothing more, and wait for what is outstanding: idle from here."""
        with self._lock:
            self.busy = False
            self._lock.wait_for(lambda: self.answered == self.sent, timeout=600)

    def warm(self) -> None:
        """The workload loaded and a first prediction made, before any block is timed."""
        self.start_predicting()
        self.stop_predicting()

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=30)


def measure(name: str, rounds: int, block: int) -> None:
    from torchlab.core.engine.adapters.loading import load_workload
    from torchlab.core.engine.seeding import seed_everything
    from torchlab.core.engine.trainer import Trainer
    from torchlab.core.records.config import build_config

    spec = WORKLOADS[name]
    config = build_config({}, {"workload": spec, "steps": 10**9, "memory_every": 0, "probe_every": 0,
                               "checkpoint_every": 0, "eval_every": 0, "options": {}, "at": []})
    seed_everything(config.seed)
    trainer = Trainer(config, load_workload(spec), observers=[], checkpoint_dir=Path(tempfile.mkdtemp(prefix="forecast-cost-")))
    trainer.train_steps(10)
    forecaster = BusyForecaster(config)
    started = time.perf_counter()
    forecaster.warm()
    print(f"{name}: the forecaster loaded the workload and made its first prediction in "
          f"{time.perf_counter() - started:.1f} s (idle training meanwhile)")
    forecaster.seconds.clear()
    per_step: dict[str, list[float]] = {"idle": [], "busy": []}
    for _ in range(rounds):
        for variant in random.sample(list(per_step), 2):
            if variant == "busy":
                forecaster.start_predicting()
            began = time.perf_counter()
            trainer.train_steps(block)
            per_step[variant].append((time.perf_counter() - began) / block)
            if variant == "busy":
                forecaster.stop_predicting()
    forecaster.close()
    idle, busy = (statistics.median(per_step[variant]) for variant in ("idle", "busy"))
    print(f"{name}: {rounds} rounds of {block} steps each way; median step {idle * 1e3:.2f} ms with the forecaster "
          f"idle, {busy * 1e3:.2f} ms with it predicting: {busy / idle:.3f}x ({(busy / idle - 1) * 100:+.1f} %); "
          f"{len(forecaster.seconds)} predictions beside training, median {statistics.median(forecaster.seconds):.2f} s each")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=sorted(WORKLOADS), action="append")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--block", type=int, default=40)
    args = parser.parse_args()
    for name in args.workload or ["resnet_small"]:
        measure(name, args.rounds, args.block)


if __name__ == "__main__":
    main()
