"""A transformers Trainer: its own ``trainer.train()`` against the engine training it as it is, side by side (issue 33).

The same Trainer twice (same initial weights, data and TrainingArguments: AdamW, a linear schedule with warm-up,
clipping at 1.0 as transformers defaults, accumulation 2):

  transformers    ``trainer.train()``, logging every 500 steps (its default), no evaluation, no checkpoints
  engine-auto     torchlab's Trainer on the factory's Trainer (core/engine/adapters/from_transformers.py): per-module grad norms
                  and update ratios at the self-timed cadence, the loss weighed by its labels as transformers does
  engine-every    the same, per-module grad norms on every step

transformers' ``train`` owns its loop, so the runners are interleaved from inside it: a callback ends its block
every K optimizer steps, runs one block of each engine runner (in a shuffled order) and starts the next block.
Each block is timed between two device synchronisations; the figure is the median over rounds of each runner's
throughput against transformers' in the same round.

    python benchmarks/hf_overhead.py                 # CPU: a 4-layer GPT-2 of 3.4M parameters
    python benchmarks/hf_overhead.py --device cuda --json hf_overhead.json

Needs ``transformers`` and ``accelerate`` (the extra ``hf``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
from pathlib import Path

import torch

from interleaved_blocks import InterleavedBlocks
from torchlab.core.engine.adapters.loading import load_workload
from torchlab.core.engine.seeding import seed_everything
from torchlab.core.engine.trainer import Trainer
from torchlab.core.records.config import build_config

try:
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel, TrainerCallback, TrainingArguments
except ImportError:
    raise SystemExit("hf_overhead.py needs transformers and accelerate: pip install 'torchlab-tui[hf]'") from None

VOCAB, LENGTH, SAMPLES = 2048, 128, 4096
#: The device, for TrainingArguments' use_cpu: main() sets it before any factory runs (the engine imports this file
#: afresh, so a global would not reach its copy).
DEVICE_VARIABLE = "TORCHLAB_HF_OVERHEAD_DEVICE"
MAX_STEPS = 10**6  # set by main(): transformers' own run length (the engine's is given)


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self) -> None:
        self.tokens = torch.randint(0, VOCAB, (SAMPLES, LENGTH), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> dict:
        return {"input_ids": self.tokens[index], "labels": self.tokens[index]}


def hf_trainer() -> transformers.Trainer:
    """The factory both runners train: a 4-layer GPT-2 built from its config (nothing downloaded)."""
    model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=LENGTH, n_embd=256, n_layer=4, n_head=4))
    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="hf-overhead-"), report_to="none", max_steps=MAX_STEPS,
        per_device_train_batch_size=8, gradient_accumulation_steps=2, learning_rate=3e-4, weight_decay=0.1,
        warmup_steps=10, lr_scheduler_type="linear", save_strategy="no", eval_strategy="no",
        use_cpu=os.environ.get(DEVICE_VARIABLE, "cpu") == "cpu", disable_tqdm=True,
    )
    return transformers.Trainer(model=model, args=args, train_dataset=RandomTokens())


def engine(spec: str, probe_every, device: str) -> Trainer:
    """The engine as a run builds it on the factory's Trainer, less the run directory and its observers; the
    settings the benchmark sets are given as a user's flags would be, the rest are TrainingArguments'."""
    given = {"steps": 10**9, "device": device, "eval_every": 0, "checkpoint_every": 0, "probe_every": probe_every}
    config = build_config({}, {"workload": spec, **given, "options": {}, "at": []})
    seed_everything(0)
    return Trainer(config, load_workload(spec), observers=[], explicit=set(given))


class Interleave(TrainerCallback):
    """transformers' optimizer steps as the host loop of interleaved blocks (benchmarks/interleaved_blocks.py)."""

    def __init__(self, blocks: InterleavedBlocks) -> None:
        self.blocks = blocks

    def on_step_end(self, args, state, control, **kwargs) -> None:
        self.blocks.at_step(state.global_step)


def main() -> None:
    global MAX_STEPS
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps-per-block", type=int, default=4)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    device = torch.device(args.device)
    os.environ[DEVICE_VARIABLE] = device.type
    warmup = 3
    MAX_STEPS = warmup + args.rounds * args.steps_per_block
    spec = f"{Path(__file__).resolve()}:hf_trainer"

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    logging.getLogger("transformers").setLevel(logging.ERROR)
    others = {"engine-auto": engine(spec, "auto", args.device), "engine-every": engine(spec, 1, args.device)}
    for runner in others.values():
        runner.train_steps(warmup)
    seed_everything(0)
    theirs = hf_trainer()
    blocks = InterleavedBlocks("transformers", others, args.steps_per_block, warmup, synchronize)
    theirs.add_callback(Interleave(blocks))
    theirs.train()

    rounds = blocks.rounds
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{torch.get_num_threads()} CPU threads"
    params = sum(p.numel() for p in theirs.model.parameters())
    print(f"GPT-2 of {params:,} parameters, batch 8 x accumulation 2 of {LENGTH} tokens, torch {torch.__version__}, "
          f"transformers {transformers.__version__}, {where}; {rounds} rounds of {args.steps_per_block} steps")
    figures = blocks.table(["transformers", "engine-auto", "engine-every"], against="transformers", label="transformers")
    if args.json:
        args.json.write_text(json.dumps({
            "parameters": params, "device": where, "torch": torch.__version__, "transformers": transformers.__version__,
            "rounds": rounds, "steps_per_block": args.steps_per_block, "runners": figures,
        }, indent=1))


if __name__ == "__main__":
    main()
