"""What ``torchlab-tui plan`` costs on a 100M-parameter model: its time and the memory it takes beside the model's
real size (issue 49: under 20 s on the 2-core box, under 10 % of the model).

    .venv/bin/python benchmarks/plan_cost.py                       # gpt100m (92M parameters), --gpus 8
    .venv/bin/python benchmarks/plan_cost.py --workload tiny_gpt

Each phase in one process, as the command runs them: torch and torchlab imported, the workload's factory (its
parameters put on meta as they are registered; its data made as it is), then every candidate's prediction.
Memory is the process's peak RSS after each phase (``ru_maxrss``): the predictions' growth is what planning
itself took; the factory's is the workload's data (gpt100m's synthetic language holds two 4096² tables) and its
passing temporaries. Last, what the model built for the plan holds in real tensors.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default=f"{ROOT / 'benchmarks' / 'gpt100m.py'}:workload")
    parser.add_argument("--gpus", default="8")
    args = parser.parse_args()
    started = time.perf_counter()
    from torchlab.core.launch.arguments import resolve_config
    from torchlab.core.engine.forecast.forecasting import Forecasting
    from torchlab.core.launch.plan import build_plan_parser
    from torchlab.core.units import format_bytes

    imported, imported_rss = time.perf_counter(), peak_rss()
    plan_args = build_plan_parser().parse_args([args.workload, "--gpus", args.gpus])
    forecasting = Forecasting.load(*resolve_config(plan_args))
    loaded, loaded_rss = time.perf_counter(), peak_rss()
    rows = [forecasting.predict(shape) for _, shape in forecasting.candidates(int(args.gpus))]
    done, done_rss = time.perf_counter(), peak_rss()
    parameters = sum(parameter.numel() for parameter in forecasting.forecast.model.parameters())
    real = sum(parameter.numel() * parameter.element_size() for parameter in forecasting.forecast.model.parameters())
    print(f"{parameters / 1e6:.0f}M parameters, {format_bytes(real)} of weights; {len(rows)} candidates")
    print(f"imports   {imported - started:5.1f} s   peak RSS {format_bytes(imported_rss)}")
    print(f"factory   {loaded - imported:5.1f} s   peak RSS {format_bytes(loaded_rss)} (+{format_bytes(loaded_rss - imported_rss)})")
    print(f"predicted {done - loaded:5.1f} s   peak RSS {format_bytes(done_rss)} (+{format_bytes(done_rss - loaded_rss)}, "
          f"{100 * (done_rss - loaded_rss) / real:.1f} % of the weights)")
    print(f"in all    {done - started:5.1f} s")
    model = forecasting.forecast.model
    held = sum(tensor.numel() * tensor.element_size() for tensor in [*model.parameters(), *model.buffers()]
               if tensor.device.type != "meta")
    print(f"the model as the plan built it holds {format_bytes(held)} in tensors ({100 * held / real:.2f} % of its "
          f"weights: its buffers; every parameter on meta)")


if __name__ == "__main__":
    main()
