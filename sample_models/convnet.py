"""Sample workload: a small BatchNorm CNN telling apart noisy drawings of ten simple shapes.

Why shapes: each 1x16x16 image holds one shape (bar, diagonal, plus, X, ring, square, disc, ...),
7 or 9 pixels across, at a random position, plus Gaussian noise. Telling a ring from a square outline
or a plus from an X needs spatial features that a convolution learns quickly, while noise and position
make it more than a lookup. Everything is drawn from its own ``torch.Generator`` seeded with
``data_seed``, so the images are the same whatever the training seed. At the default size the model
gets close to perfect validation accuracy within ~200 steps; raise ``noise_std`` for a harder task.

BatchNorm is there on purpose: its running statistics are buffers that change in the forward pass,
which exercises the engine's checkpointing, evaluation and resume paths.

Recommended optimizer: AdamW with lr 1e-3 (the engine default) is enough; no higher lr is needed.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from torchlab.core.workload import Workload

ShapeMask = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _horizontal_bar(dx: torch.Tensor, dy: torch.Tensor, radius: torch.Tensor) -> torch.Tensor:
    return (dy == 0) & (dx.abs() <= radius)


def _vertical_bar(dx: torch.Tensor, dy: torch.Tensor, radius: torch.Tensor) -> torch.Tensor:
    return (dx == 0) & (dy.abs() <= radius)


def _diagonal(dx: torch.Tensor, dy: torch.Tensor, radius: torch.Tensor) -> torch.Tensor:
    return (dx == dy) & (dx.abs() <= radius)


def _anti_diagonal(dx: torch.Tensor, dy: torch.Tensor, radius: torch.Tensor) -> torch.Tensor:
    return (dx == -dy) & (dx.abs() <= radius)


def _plus(dx: torch.Tensor, dy: torch.Tensor, radius: torch.Tensor) -> torch.Tensor:
    return _horizontal_bar(dx, dy, radius) | _vertical_bar(dx, dy, radius)


def _cross(dx: torch.Tensor, dy: torch.Tensor, radius: torch.Tensor) -> torch.Tensor:
    return _diagonal(dx, dy, radius) | _anti_diagonal(dx, dy, radius)


def _square_outline(dx: torch.Tensor, dy: torch.Tensor, radius: torch.Tensor) -> torch.Tensor:
    return torch.maximum(dx.abs(), dy.abs()) == radius


def _filled_square(dx: torch.Tensor, dy: torch.Tensor, radius: torch.Tensor) -> torch.Tensor:
    return torch.maximum(dx.abs(), dy.abs()) <= radius


def _ring(dx: torch.Tensor, dy: torch.Tensor, radius: torch.Tensor) -> torch.Tensor:
    return ((dx.square() + dy.square()).float().sqrt() - radius).abs() < 0.5


def _disc(dx: torch.Tensor, dy: torch.Tensor, radius: torch.Tensor) -> torch.Tensor:
    return dx.square() + dy.square() <= radius.square()


# The class index of a shape is its position in this list.
SHAPES: tuple[ShapeMask, ...] = (
    _horizontal_bar,
    _vertical_bar,
    _diagonal,
    _anti_diagonal,
    _plus,
    _cross,
    _square_outline,
    _filled_square,
    _ring,
    _disc,
)
NUM_CLASSES = len(SHAPES)
_MIN_RADIUS = 3
_MAX_RADIUS = 4


def draw_shapes(
    *, num_samples: int, image_size: int, noise_std: float, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(images, labels)``: images of shape (N, 1, S, S), one random shape each, plus noise."""
    if image_size < 2 * _MAX_RADIUS + 1:
        raise ValueError(
            f"image_size must be at least {2 * _MAX_RADIUS + 1} to fit every shape, got {image_size}."
        )
    labels = torch.randint(NUM_CLASSES, (num_samples,), generator=generator)
    radius = torch.randint(_MIN_RADIUS, _MAX_RADIUS + 1, (num_samples,), generator=generator)
    # Centres keep the whole shape inside the image: radius <= centre <= size - 1 - radius.
    free_span = (image_size - 2 * radius).float()
    centre_x = radius + (torch.rand(num_samples, generator=generator) * free_span).long()
    centre_y = radius + (torch.rand(num_samples, generator=generator) * free_span).long()
    brightness = 0.75 + 0.5 * torch.rand(num_samples, generator=generator)
    noise = noise_std * torch.randn(num_samples, 1, image_size, image_size, generator=generator)

    coords = torch.arange(image_size)
    dx = coords.view(1, 1, -1) - centre_x.view(-1, 1, 1)
    dy = coords.view(1, -1, 1) - centre_y.view(-1, 1, 1)
    radius = radius.view(-1, 1, 1)
    masks = torch.zeros(num_samples, image_size, image_size, dtype=torch.bool)
    for class_index, shape_mask in enumerate(SHAPES):
        chosen = labels == class_index
        masks[chosen] = shape_mask(dx[chosen], dy[chosen], radius[chosen])
    images = masks.unsqueeze(1).float() * brightness.view(-1, 1, 1, 1) + noise
    return images, labels


class Stage(nn.Module):
    """Two 3x3 conv + BatchNorm layers with a residual shortcut; the first conv may downsample."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            # A 1x1 projection so the residual sum has matching shape.
            self.shortcut = nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ShapeConvNet(nn.Module):
    """Stem, a ``stages`` Sequential of downsampling residual stages, global max pooling, ``head``.

    ``stages`` is the largest Sequential by parameter count, so the engine's default activation
    checkpointing wraps each stage. Global *max* pooling asks "is this feature anywhere?", which
    suits one small shape at a random position better than averaging it with the empty background
    (it also learns noticeably faster here).
    """

    def __init__(
        self, in_channels: int, stem_channels: int, stage_channels: tuple[int, ...], num_classes: int
    ) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, stem_channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(stem_channels),
            nn.ReLU(),
        )
        stages = []
        channels = stem_channels
        for out_channels in stage_channels:
            stages.append(Stage(channels, out_channels, stride=2))
            channels = out_channels
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveMaxPool2d(1)
        self.head = nn.Linear(channels, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        features = self.pool(self.stages(self.stem(images)))
        return self.head(features.flatten(1))


def classification_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Cross-entropy of the model's shape logits against the true shape."""
    images, labels = batch
    return F.cross_entropy(model(images), labels)


def make_workload(
    *,
    image_size: int = 16,
    stem_channels: int = 16,
    stage_channels: tuple[int, ...] = (32, 64),
    num_train: int = 8192,
    num_val: int = 1024,
    noise_std: float = 0.2,
    batch_size: int = 128,
    data_seed: int = 0,
) -> Workload:
    """The CNN workload at any size; the defaults are what the CLI trains."""
    generator = torch.Generator().manual_seed(data_seed)
    images, labels = draw_shapes(
        num_samples=num_train + num_val, image_size=image_size, noise_std=noise_std, generator=generator
    )
    train = TensorDataset(images[:num_train], labels[:num_train])
    val = TensorDataset(images[num_train:], labels[num_train:])
    model = ShapeConvNet(
        in_channels=1,
        stem_channels=stem_channels,
        stage_channels=tuple(stage_channels),
        num_classes=NUM_CLASSES,
    )
    return Workload(
        model=model, dataset=train, val_dataset=val, loss_fn=classification_loss, batch_size=batch_size
    )


def workload() -> Workload:
    """Zero-argument factory used by the CLI."""
    return make_workload()
