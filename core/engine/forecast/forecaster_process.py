"""The run's forecaster: ``python -m torchlab.core.engine.forecast.forecaster_process``, started by its supervisor's
``Forecaster`` (forecaster.py) the first time the app asks what fits.

A process of its own because a prediction is a training step run on fake tensors: seconds of Python that hold the
GIL throughout, which a thread of the trainer's process would take from the training loop. Here it runs in Linux's
idle class (a core only where training does not want it: +0.5 % a step while it predicts, where niced it cost 13 %;
``benchmarks/forecast_cost.py``), on one thread, with the workload built without its weights as ``torchlab-tui plan``
builds it (``Forecasting.load``): what it costs the run is idle cycles and the workload's dataset held a second time.

Its stdin: the run's configuration first, one JSON line (``config``: the TOML text; ``explicit``: the settings the
user gave), then one request a line (``settings``: a ``StepShape``'s fields; ``change``: how they differ from the
settings in force; ``held_bytes``: what training's tensors hold now, which a CPU's RAM can be given back from;
``step``; ``ratio``: measured over predicted on this run; ``longest_batch``: the shapes of the run's longest batch so far,
and ``longest_elements`` their elements, which the answer repeats). Its stdout: one ``memory_predicted`` a request, a line
of the protocol. It ends when its stdin closes. A workload that cannot be loaded answers every request with why;
nothing it meets reaches a terminal (its stderr is the run's ``forecaster.log``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import IO, Any

from torchlab.core.engine.forecast.capacity import Capacity
from torchlab.core.errors import TorchlabError
from torchlab.core.units import format_bytes
from torchlab.core.wire.events import MemoryPredicted

#: How much lower than training it runs (``nice``'s increment) outside the idle class: what fits where there is no
#: idle class (not Linux), and the OOM rescue's predictions (``_priority_for``).
NICENESS = 10


def serve(requests: IO[str], answers: IO[str]) -> None:
    """Answer each request on ``requests`` with its ``memory_predicted`` line on ``answers``, until ``requests`` ends."""
    first = requests.readline()
    if not first:
        return
    setup = json.loads(first)
    idle = bool(setup.get("idle", True))  # --forecast-priority
    _priority_for(urgent=bool(setup.get("urgent")) or not idle)  # torch's import and the workload's build at the first's
    forecasting, cannot_load = _load(setup)
    for line in requests:
        request = json.loads(line)
        _priority_for(urgent=bool(request.get("urgent")) or not idle)
        answers.write(_answer(forecasting, cannot_load, request).json_text() + "\n")
        answers.flush()


def _load(setup: dict[str, Any]) -> tuple[Any, str]:
    """The workload's forecast (``Forecasting``), or why it could not be made."""
    import torch

    from torchlab.core.engine.forecast.forecasting import Forecasting
    from torchlab.core.records.config import config_from_toml

    torch.set_num_threads(1)
    try:
        config = config_from_toml(setup["config"], "the run's configuration")
        return Forecasting.load(config, set(setup["explicit"])), ""
    except TorchlabError as error:
        return None, f"the forecaster could not load the workload: {error}"
    except Exception as error:  # the workload's own code, run again here: said, never a traceback on a terminal
        return None, f"the forecaster could not load the workload: {type(error).__name__}: {error}"


def _answer(forecasting: Any, cannot_load: str, request: dict[str, Any]) -> MemoryPredicted:
    from torchlab.core.engine.forecast.step_shape import StepShape

    settings, step, ratio = request["settings"], request["step"], request.get("ratio")
    asked = dict(step=step, settings=settings, change=request["change"], ratio=ratio,
                 longest_batch_elements=request.get("longest_elements"))
    if forecasting is None:
        return MemoryPredicted(**asked, prediction=None, capacity_bytes=0, capacity="", error=cannot_load)
    capacity = _capacity(forecasting, request["held_bytes"])
    shape = StepShape(**settings)
    try:
        prediction, cannot = forecasting.predict(shape, request.get("longest_batch"))
    except Exception as error:  # an op of the workload's that fake tensors meet in a way torch does not name
        prediction, cannot = None, f"{type(error).__name__}: {error}"
    room = capacity.room(shape.world_size)
    if prediction is None:
        return MemoryPredicted(**asked, prediction=None, capacity_bytes=room, capacity=capacity.source, error=str(cannot))
    peak = round(prediction.peak_bytes * (ratio or 1.0))
    verdict = "" if prediction.refused is not None else capacity.verdict(peak, shape.world_size)
    return MemoryPredicted(**asked, prediction=prediction, capacity_bytes=room, capacity=capacity.source, verdict=verdict)


def _capacity(forecasting: Any, held_bytes: int) -> Capacity:
    """What a rank has to fit in. A GPU's memory is its own, read through NVML: this process never makes a CUDA
    context, which would take hundreds of MiB of the GPU training uses. A CPU's RAM available now leaves out what
    training holds, which a change gives back before it takes: both are the room a change has."""
    if forecasting.device.type == "cuda":
        return _gpu_capacity(forecasting)
    capacity = forecasting.capacity()
    total = capacity.bytes + held_bytes
    return Capacity(total, shared=True, source=f"{format_bytes(total)} of RAM, available now with what training "
                                               f"holds ({format_bytes(held_bytes)}), shared by the ranks")


def _gpu_capacity(forecasting: Any) -> Capacity:
    from torchlab.core.engine.measure.nvml import Nvml

    nvml = Nvml()
    try:
        gpus = nvml.sample([])
    finally:
        nvml.close()
    gpu = gpus[forecasting.device.index or 0] if gpus else None
    if gpu is None or gpu.memory_total_bytes is None:
        return forecasting.capacity()
    return Capacity(gpu.memory_total_bytes, shared=False,
                    source=f"{format_bytes(gpu.memory_total_bytes)} per rank ({gpu.name or 'the GPU'}, by NVML)")


def _priority_for(*, urgent: bool) -> None:
    """What fits (not ``urgent``) runs in Linux's idle class (``SCHED_IDLE``): the scheduler gives it a core only where
    no other process wants it, so a prediction waits for the training loop's idle moments instead of taking its share
    of a core. The OOM rescue's (``urgent``: the ranks are down, waiting for it), and everything under
    ``--forecast-priority low``, runs niced, as it starts: an idle-class process waits as long as anything else on the
    machine keeps the cores busy. Back from the idle class only where the system lets it (``RLIMIT_NICE``; root); else
    the rescue waits at idle priority, and gives up in time."""
    if not hasattr(os, "SCHED_IDLE"):
        return
    try:
        if urgent:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        else:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except OSError:
        pass


def main() -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", help="the run it predicts for: on the command line so that ps tells")
    parser.parse_args()
    os.nice(NICENESS)
    answers, sys.stdout = sys.stdout, sys.stderr  # what the workload's own code prints goes to the log, not among them
    serve(sys.stdin, answers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
