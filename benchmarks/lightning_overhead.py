"""Our engine against PyTorch Lightning with per-step gradient-norm logging, side by side in one run (issue 17).

Four runners train the same workload (same initial weights, same data, AdamW at a constant LR):

  bare            the plain loop every PyTorch user writes (probe_overhead.BareLoop): the baseline
  engine-auto     torchlab's Trainer with its defaults: per-module grad norms at the self-timed cadence
  engine-every    torchlab's Trainer with per-module grad norms on every step
  lightning       a LightningModule whose ``on_before_optimizer_step`` logs
                  ``lightning.pytorch.utilities.grad_norm(self, norm_type=2)`` every step (the pattern
                  Lightning documents), a CSV logger written every step, no progress bar, no checkpoints

Lightning's ``fit`` owns its loop, so the runners are interleaved from inside it: a callback ends
Lightning's block every K steps, runs one block of each other runner (in a shuffled order), and starts
Lightning's next block. Each block is timed between two device synchronisations. The figure is the median
over rounds of each runner's throughput against the bare loop's in the same round.

    python benchmarks/lightning_overhead.py --device cuda --json lightning_tiny_gpt.json
    python benchmarks/lightning_overhead.py --device cuda --workload gpt100m --json lightning_gpt100m.json

Needs ``lightning`` or ``pytorch-lightning`` (not a dependency of torchlab-tui).
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import tempfile
import warnings
from pathlib import Path

import torch

import gpt100m
from interleaved_blocks import InterleavedBlocks
from probe_overhead import BareLoop, make_engine
from torchlab.core.engine.adapters.loading import load_workload
from torchlab.core.engine.seeding import seed_everything

try:
    import lightning.pytorch as pl
    from lightning.pytorch.loggers import CSVLogger
    from lightning.pytorch.utilities import grad_norm
except ImportError:
    try:
        import pytorch_lightning as pl
        from pytorch_lightning.loggers import CSVLogger
        from pytorch_lightning.utilities import grad_norm
    except ImportError:
        raise SystemExit("lightning_overhead.py needs Lightning: pip install lightning (or pytorch-lightning)") from None

LR = 1e-3


class LoggedGradNorms(pl.LightningModule):
    """The workload's model and loss, with the gradient norms of every parameter logged every step."""

    def __init__(self, workload) -> None:
        super().__init__()
        self.model = workload.model
        self.loss_fn = workload.loss_fn

    def training_step(self, batch, batch_index):
        loss = self.loss_fn(self.model, batch)
        self.log("loss", loss)
        return loss

    def on_before_optimizer_step(self, optimizer) -> None:
        self.log_dict(grad_norm(self, norm_type=2))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.model.parameters(), lr=LR)


class Interleave(pl.Callback):
    """Lightning's steps as the host loop of interleaved blocks (benchmarks/interleaved_blocks.py)."""

    def __init__(self, blocks: InterleavedBlocks) -> None:
        self.blocks, self.steps = blocks, 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_index) -> None:
        self.steps += 1
        self.blocks.at_step(self.steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="tiny_gpt", help="a sample, gpt100m, or path.py:factory")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps-per-block", type=int, default=10)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    spec = gpt100m.SPEC if args.workload == "gpt100m" else args.workload
    device = torch.device(args.device)

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    seed_everything(0)
    template = load_workload(spec)
    batch_size = template.batch_size or 32
    warmup = 3
    others = {
        "bare": BareLoop(copy.deepcopy(template), batch_size, LR, device=device),
        "engine-auto": make_engine(copy.deepcopy(template), spec, batch_size, LR, "auto", args.device),
        "engine-every": make_engine(copy.deepcopy(template), spec, batch_size, LR, 1, args.device),
    }
    for runner in others.values():
        runner.train_steps(warmup)
    blocks = InterleavedBlocks("lightning", others, args.steps_per_block, warmup, synchronize)
    loader = torch.utils.data.DataLoader(
        template.dataset, batch_size=batch_size, shuffle=True, drop_last=True,
        generator=torch.Generator().manual_seed(0), pin_memory=device.type == "cuda",
        collate_fn=template.collate_fn,
    )
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")  # Lightning's own use of torch's pytree
    with tempfile.TemporaryDirectory() as logs:
        lightning = pl.Trainer(
            accelerator="gpu" if device.type == "cuda" else "cpu", devices=[device.index or 0] if device.type == "cuda" else 1,
            max_steps=warmup + args.rounds * args.steps_per_block, max_epochs=-1, logger=CSVLogger(logs),
            log_every_n_steps=1, enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False,
            callbacks=[Interleave(blocks)], num_sanity_val_steps=0,
        )
        lightning.fit(LoggedGradNorms(copy.deepcopy(template)), train_dataloaders=loader)

    rounds = blocks.rounds
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{torch.get_num_threads()} CPU threads"
    params = sum(p.numel() for p in template.model.parameters())
    print(f"{args.workload}: {params:,} parameters, batch {batch_size}, torch {torch.__version__}, "
          f"Lightning {pl.__version__}, {where}; {rounds} rounds of {args.steps_per_block} steps")
    figures = blocks.table(["bare", "engine-auto", "engine-every", "lightning"], against="bare", label="bare")
    if args.json:
        args.json.write_text(json.dumps({
            "workload": args.workload, "parameters": params, "batch_size": batch_size, "device": where,
            "torch": torch.__version__, "lightning": pl.__version__, "rounds": rounds,
            "steps_per_block": args.steps_per_block, "runners": figures,
        }, indent=1))


if __name__ == "__main__":
    main()
