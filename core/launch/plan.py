"""``torchlab-tui plan [WORKLOAD] [--device-memory 80GiB] [--gpus 8] [settings]``: will it fit, before launching.

The workload is built with its parameters on the ``meta`` device (core/engine/forecast/fake_twin.py
``parameters_on_meta``: the model's weights are never held), and a step of each candidate setting is run on fake
tensors (core/engine/forecast/memory_forecast.py): nothing trains, nothing is allocated but what the workload's
factory makes of its data. The table lists each candidate's predicted peak per rank beside the memory it must fit
in, with what the peak is made of; ``--json`` writes the same as one JSON object a line, for a script.

The memory a rank must fit in: ``--device-memory`` (each GPU's, as on the box the run will launch on); else this
machine's: the CUDA device's total, or on a CPU the memory available now, shared by the ranks. A peak under
``FITS_SHARE`` of it fits; up to all of it is tight (what the forecast does not model has to fit there too).

Exit codes: 0 the table was printed (whatever fits); 1 no candidate could be predicted (an op fake tensors cannot
run: the paragraph names it); 2 bad input (a setting, a size, the workload).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from torchlab.core.errors import (
    EXIT_INTERRUPTED, EXIT_OK, ConfigError, ForecastError, TorchlabError, exit_status, printable,
)
from torchlab.core.launch.arguments import command_parser, resolve_config
from torchlab.core.options import LIVE_OPTIONS
from torchlab.core.records.settings import SETTINGS
from torchlab.core.engine.forecast.capacity import FITS_SHARE, Capacity
from torchlab.core.units import format_bytes, parse_bytes

#: The widest a candidate's change is written on its row (77 columns in all); a longer one has a line of its own.
_CHANGE_WIDTH = 28


def build_plan_parser() -> argparse.ArgumentParser:
    parser = command_parser("plan")
    parser.add_argument("workload", nargs="?", default=None, help="as for training: a built-in sample, "
                        "path/to/file.py[:factory] or package.module:factory (default: the sample mlp)")
    parser.add_argument("--device-memory", metavar="SIZE", help="the memory of each GPU the run will have, as 80GiB "
                        "or 80GB (default: this machine's: its GPU's, or the RAM available now, shared by the ranks)")
    parser.add_argument("--gpus", type=int, metavar="N", help="the ranks to plan for: DDP and FSDP2 on N are listed "
                        "(default: the configured --world-size)")
    parser.add_argument("--json", action="store_true", help="one JSON object a line, each candidate's prediction")
    parser.add_argument("--config", type=Path, metavar="FILE.toml", help="settings file (a run's config.toml works)")
    for setting in SETTINGS:
        if setting.group in ("training", "live"):
            setting.add_flag(parser)
    for option in LIVE_OPTIONS:
        if not option.setting:
            option.add_flag(parser)
    parser.set_defaults(**{setting.name: None for setting in SETTINGS if setting.group not in ("training", "live")},
                        at=[], trial=[])
    return parser


def main(argv: list[str]) -> int:
    args = build_plan_parser().parse_args(argv)
    try:
        return _plan(args)
    except TorchlabError as error:
        print(f"torchlab-tui plan: {printable(error, keep_lines=True)}", file=sys.stderr)
        return exit_status(error)  # 1 where nothing could be predicted (ForecastError), 2 for bad input
    except KeyboardInterrupt:
        print("torchlab-tui plan: interrupted; nothing was trained or written.", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `torchlab-tui plan --json | head -1`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush does not fail again
        return EXIT_OK


def _plan(args: argparse.Namespace) -> int:
    given = _given_memory(args.device_memory)
    if args.gpus is not None and not 1 <= args.gpus <= 1024:
        raise ConfigError(f"gpus (--gpus) {args.gpus}: a whole number of ranks from 1 to 1024.")
    config, explicit = resolve_config(args)

    try:
        from torchlab.core.engine.forecast.forecasting import Forecasting  # imports torch
    except ImportError as missing:  # a torch before its memory trackers (torch.distributed._tools)
        import torch

        raise ForecastError(f"plan predicts with PyTorch's MemTracker and FSDPMemTracker, which this torch "
                            f"{torch.__version__} lacks ({missing}); install a newer torch (2.6 or later) to plan."
                            ) from None

    forecasting = Forecasting.load(config, explicit)
    capacity = given or forecasting.capacity()
    started = time.perf_counter()
    candidates = forecasting.candidates(args.gpus)
    first = forecasting.predict(candidates[0][1])  # the configured step: every other needs what it needs
    if isinstance(first[1], ForecastError):
        raise first[1]
    width = min(shutil.get_terminal_size().columns, 100) - 1
    if not args.json:
        print(textwrap.fill(forecasting.heading(), width))
        print(textwrap.fill(f"memory: {capacity.source}", width), end="\n\n")
        print(_TABLE_HEADER)
    for index, (change, shape) in enumerate(candidates):  # each row as it is predicted: a large model takes seconds
        prediction, cannot = first if index == 0 else forecasting.predict(shape)
        _print_row(args.json, change, shape, prediction, cannot, capacity, width)
    largest = forecasting.largest_batch(capacity)
    if largest is not None:  # found on a line through two rows, then predicted like them
        _print_row(args.json, *largest, *forecasting.predict(largest[1]), capacity, width)
        candidates.append(largest)
    if not args.json:
        print()
        notes = (f"fits: yes under {round(FITS_SHARE * 100)} % of the memory, tight up to all of it, no above. "
                 f"weights: parameters, the gradients made so far, optimizer state; other: FSDP2's gathered "
                 f"parameters and buffers, DDP's buckets, backward's temporaries. {forecasting.footnotes()} "
                 f"{len(candidates)} settings predicted in {time.perf_counter() - started:.1f} s.")
        print(textwrap.fill(notes, width))
    return EXIT_OK


def _print_row(as_json: bool, change: str, shape: Any, prediction: Any, cannot: Exception | None, capacity: Capacity,
               width: int) -> None:
    if as_json:
        print(json.dumps(_json_row(change, prediction, cannot, capacity, shape.world_size)), flush=True)
    else:
        print(_row(change, shape.world_size, prediction, cannot, capacity, width), flush=True)


def _given_memory(text: str | None) -> Capacity | None:
    if text is None:
        return None
    try:
        size = parse_bytes(text)
        return Capacity(size, shared=False, source=f"{format_bytes(size)} per rank (--device-memory)")
    except ValueError as error:
        raise ConfigError(f"device memory (--device-memory): {error}.") from None


_TABLE_HEADER = (f"{'change':<{_CHANGE_WIDTH}}  {'peak/rank':>9} {'fits':<5} {'weights':>9} {'activations':>11} "
                 f"{'other':>9}")


def _row(change: str, world_size: int, prediction: Any, cannot: Exception | None, capacity: Capacity, width: int) -> str:
    """One candidate's line (two where its change is longer than its column: the change alone, the figures under
    it): the peak, whether it fits, and what the peak is made of; or why it cannot run."""
    lines, label = [], change
    if len(change) > _CHANGE_WIDTH:
        lines, label = [change], ""
    if cannot is not None or prediction.refused is not None:
        why = str(cannot) if cannot is not None else prediction.refused
        lines.append(textwrap.fill(f"{label:<{_CHANGE_WIDTH}}  cannot run: {why}", width,
                                   subsequent_indent=" " * (_CHANGE_WIDTH + 2)))
        return "\n".join(lines)
    lines.append(f"{label:<{_CHANGE_WIDTH}}  {format_bytes(prediction.peak_bytes):>9} "
                 f"{capacity.verdict(prediction.peak_bytes, world_size):<5} {format_bytes(prediction.weights_at_peak):>9} "
                 f"{format_bytes(prediction.at_peak['activations']):>11} {format_bytes(prediction.other_at_peak):>9}")
    return "\n".join(lines)


def _json_row(change: str, prediction: Any, cannot: Exception | None, capacity: Capacity, world_size: int) -> dict:
    if cannot is not None:
        return {"change": change, "cannot": str(cannot)}
    row: dict[str, Any] = {"change": change, "prediction": dataclasses.asdict(prediction)}
    if prediction.refused is None:
        row["fits"] = capacity.verdict(prediction.peak_bytes, world_size)
        row["room_bytes"] = capacity.room(world_size)
    return row
