"""LightningModules written as Lightning's users write them, for tests/engine/adapters/test_from_lightning.py: the engine must train
each as its own code says (its step, its logged metrics, its optimizer's groups and its step scheduler), or refuse
it with the reason."""

from __future__ import annotations

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def _data(samples: int, seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(samples, 8, generator=generator)
    return TensorDataset(inputs, inputs.sum(dim=1, keepdim=True).tanh())


class Regressor(L.LightningModule):
    """A body of blocks (activation checkpointing wraps them) and a head, each with its own LR, warmed up linearly
    over 4 optimizer steps by a step-interval scheduler; it logs its mean absolute error in training and validation."""

    def __init__(self, scheduler_form: str = "dict") -> None:
        super().__init__()
        self.body = nn.Sequential(*(nn.Sequential(nn.Linear(8 if i == 0 else 16, 16), nn.ReLU()) for i in range(3)))
        self.head = nn.Linear(16, 1)
        self.scheduler_form = scheduler_form

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))

    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        predictions = self(inputs)
        loss = nn.functional.mse_loss(predictions, targets)
        self.log("train_mae", (predictions - targets).abs().mean(), prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        inputs, targets = batch
        predictions = self(inputs)
        self.log_dict({"val_loss": nn.functional.mse_loss(predictions, targets), "val_mae": (predictions - targets).abs().mean()})

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW([
            {"params": self.body.parameters(), "lr": 1e-2, "name": "body"},
            {"params": self.head.parameters(), "lr": 1e-3, "name": "head"},
        ], weight_decay=0.01)
        warmup = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.25, total_iters=4)
        if self.scheduler_form == "epoch":
            return [optimizer], [warmup]  # Lightning's default interval there: "epoch"
        if self.scheduler_form == "none":
            return optimizer
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": warmup, "interval": "step"}}

    def train_dataloader(self):
        return DataLoader(_data(256, 7), batch_size=16, shuffle=True)

    def val_dataloader(self):
        return DataLoader(_data(64, 8), batch_size=16)


class Data(L.LightningDataModule):
    def setup(self, stage: str) -> None:
        self.train, self.validation = _data(128, 3), _data(32, 4)

    def train_dataloader(self):
        return DataLoader(self.train, batch_size=8)

    def val_dataloader(self):
        return DataLoader(self.validation, batch_size=8)


class Manual(Regressor):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False


class TwoOptimizers(Regressor):
    def configure_optimizers(self):
        return [torch.optim.SGD(self.body.parameters(), lr=0.1), torch.optim.SGD(self.head.parameters(), lr=0.1)]


class ClipsItself(Regressor):
    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        self.clip_gradients(optimizer, gradient_clip_val=0.5)


def module() -> Regressor:
    return Regressor()


def without_scheduler() -> Regressor:
    return Regressor("none")


def with_data_module() -> tuple[Regressor, Data]:
    return Regressor(), Data()


def manual() -> Manual:
    return Manual()


def two_optimizers() -> TwoOptimizers:
    return TwoOptimizers()


def epoch_scheduler() -> Regressor:
    return Regressor("epoch")


def clips_itself() -> ClipsItself:
    return ClipsItself()


class OneCycle(Regressor):
    """OneCycleLR over the Trainer's estimated_stepping_batches, as Lightning's users write it."""

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters())
        total = self.trainer.estimated_stepping_batches
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.OneCycleLR(
            optimizer, max_lr=1e-2, total_steps=total), "interval": "step"}}


class ReadsTheLogger(Regressor):
    def configure_optimizers(self):
        self.trainer.logger.log_hyperparams({"lr": 1e-3})
        return torch.optim.AdamW(self.parameters())


def one_cycle() -> OneCycle:
    return OneCycle()


def reads_the_logger() -> ReadsTheLogger:
    return ReadsTheLogger()


class WithTorchmetrics(Regressor):
    """Logs a torchmetrics Metric as itself, as Lightning's docs show: its value on the step's batch."""

    def __init__(self) -> None:
        super().__init__()
        import torchmetrics

        self.mae = torchmetrics.MeanAbsoluteError()

    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        predictions = self(inputs)
        self.mae(predictions, targets)
        self.log("metric_mae", self.mae)
        self.log("train_mae", (predictions - targets).abs().mean())
        return nn.functional.mse_loss(predictions, targets)


def with_torchmetrics() -> WithTorchmetrics:
    return WithTorchmetrics()


class ReadsItsPosition(Regressor):
    """Logs where Lightning says it is: self.global_step (optimizer steps taken) and self.current_epoch."""

    def training_step(self, batch, batch_idx):
        self.log("global_step", float(self.global_step))
        self.log("epoch", float(self.current_epoch))
        self.log("batch_idx", float(batch_idx))
        return super().training_step(batch, batch_idx)


def reads_its_position() -> ReadsItsPosition:
    return ReadsItsPosition()


class SmallCNN(L.LightningModule):
    """A CNN as Lightning's users write one: conv stages with BatchNorm, then a classifier whose flattened Linear holds
    most of the parameters (activation checkpointing must wrap the stages, not Flatten/ReLU/Dropout/Linear)."""

    def __init__(self, checkpoint_blocks: list[str] | None = None) -> None:
        super().__init__()
        stage = lambda channels_in, channels_out: nn.Sequential(  # noqa: E731
            nn.Conv2d(channels_in, channels_out, 3, padding=1), nn.BatchNorm2d(channels_out), nn.ReLU())
        self.features = nn.Sequential(stage(1, 4), stage(4, 8), stage(8, 8))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(8 * 8 * 8, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 3))
        if checkpoint_blocks is not None:
            self.checkpoint_blocks = checkpoint_blocks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))

    def training_step(self, batch, batch_idx):
        images, labels = batch
        return nn.functional.cross_entropy(self(images), labels)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def train_dataloader(self):
        generator = torch.Generator().manual_seed(5)
        images = torch.randn(64, 1, 8, 8, generator=generator)
        return DataLoader(TensorDataset(images, torch.randint(0, 3, (64,), generator=generator)), batch_size=16)


def cnn() -> SmallCNN:
    return SmallCNN()


def cnn_naming_its_blocks() -> SmallCNN:
    return SmallCNN(checkpoint_blocks=["features.1", "features.2"])
