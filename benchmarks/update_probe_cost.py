"""What optimizer health costs (core/engine/measure/update_probe.py): the update-to-weight ratios, weight norms and Adam's
moments of the steps the probe measures.

    .venv/bin/python benchmarks/update_probe_cost.py                 # resnet_small and tiny_gpt on the CPU
    python3 benchmarks/update_probe_cost.py --device cuda --workloads tiny_gpt gpt100m   # on a GPU (the GPU pass)

One trainer per workload, the probe on every step (``--probe-every 1``): its update probe's two parts, the copy of
the parameters before the optimizer step and the norms after it, are timed on the training thread for ``--steps``
steps (on CUDA with a synchronisation around each, so their kernels count: an upper bound, as the training thread
would not wait), against the step's time. That is the cost per measured step. At the default cadence (``auto``) the
probe times itself, update included, and measures a step only as often as that keeps within 0.25 % of the step
time: the share of training is the per-step cost over the interval the cadence chose, printed beside it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WORKLOADS = {"resnet_small": f"{ROOT / 'benchmarks' / 'resnet_small.py'}:workload", "tiny_gpt": "tiny_gpt",
             "gpt100m": f"{ROOT / 'benchmarks' / 'gpt100m.py'}:workload"}


def trainer_for(spec: str, device: str, probe_every: str):
    from torchlab.core.engine.adapters.loading import load_workload
    from torchlab.core.engine.seeding import seed_everything
    from torchlab.core.engine.trainer import Trainer
    from torchlab.core.records.config import build_config

    config = build_config({}, {"workload": spec, "steps": 10**9, "seed": 0, "checkpoint_every": 0, "eval_every": 0,
                               "memory_every": 0, "probe_every": probe_every, "device": device, "options": {},
                               "at": []})
    seed_everything(config.seed)
    return Trainer(config, load_workload(spec), samples_telemetry=False)


def measure(name: str, device: str, steps: int) -> None:
    import torch

    spec = WORKLOADS[name]
    trainer = trainer_for(spec, device, "1")
    probe = trainer.instruments.update_probe
    spent: list[float] = []
    synchronize = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def timed(method):
        def wrapper(*args, **kwargs):
            synchronize()
            started = time.perf_counter()
            result = method(*args, **kwargs)
            synchronize()
            spent.append(time.perf_counter() - started)
            return result
        return wrapper

    probe.before_update = timed(probe.before_update)
    probe.after_update = timed(probe.after_update)
    trainer.train_steps(5)
    spent.clear()
    step_times = []
    for _ in range(steps):
        synchronize()
        started = time.perf_counter()
        trainer.train_steps(1)
        synchronize()
        step_times.append(time.perf_counter() - started)
    per_step = [before + after for before, after in zip(spent[::2], spent[1::2])]
    cost, step = statistics.median(per_step), statistics.median(step_times)
    parameters = sum(p.numel() for p in trainer.model.parameters())
    adam = "with Adam's moments" if any("exp_avg" in s for s in trainer.optimizer.state.values()) else "no moments"
    auto = trainer_for(spec, device, "auto")
    auto.train_steps(60)
    interval = auto.instruments.cadence.interval
    print(f"{name:12} {parameters:,} parameters ({adam}), step {1000 * step:.2f} ms with the probe: the update's "
          f"figures {1000 * cost:.3f} ms ({100 * cost / step:.2f} % of a measured step; copy "
          f"{1000 * statistics.median(spent[::2]):.3f} ms); at auto a step in {interval} is measured: "
          f"{100 * cost / step / interval:.3f} % of training", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="+", default=["resnet_small", "tiny_gpt"], choices=list(WORKLOADS))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    for name in args.workloads:
        measure(name, args.device, args.steps)


if __name__ == "__main__":
    main()
