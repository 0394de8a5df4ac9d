"""What the trainer reports to: the base of every observer. Torch-free."""

from __future__ import annotations

from torchlab.core.wire.metrics_row import MetricsRow
from torchlab.core.wire.protocol import Message
from torchlab.core.wire.payloads import TelemetrySample


class TrainerObserver:
    """Receives every report, event and telemetry sample; override what you need (each defaults to nothing).

    The run directory, the progress bar and the app's outbox are observers. They are called on the
    training thread (telemetry: on the sampler's thread), so they must be quick.
    """

    def on_metrics(self, row: MetricsRow) -> None:
        pass

    def on_event(self, event: Message) -> None:
        """A typed event (core/wire/events.py, or a protocol message the app also gets)."""
        pass

    def on_telemetry(self, sample: TelemetrySample) -> None:
        pass

    def leaving(self, status: str, step: int, message: str) -> None:
        """The process leaves now without its run returning (a hang ended: core/engine/parallel/hang_watch.py), on
        another thread than training's: deliver what is held, and the run's end (``status``, at ``step``: ``message``)."""
        pass

    def before_checkpoint(self, step: int) -> None:
        """A checkpoint of ``step`` is about to be written: write what is held of the steps up to it. A kill after
        the checkpoint is on disk would otherwise lose it for good: the resumed run trains only the steps after."""
        pass
