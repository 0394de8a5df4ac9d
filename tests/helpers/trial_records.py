"""A trial's arm as the trainer reports it, for the tests of the words and verdicts made of trials."""

from __future__ import annotations

from torchlab.core.wire.payloads import TrialArm


def trial_arm(label: str, ms: float, *, spread: tuple[float, float] = (0.98, 1.02), activations: int = 100,
              losses: tuple[float, ...] = (2.5,), others: float | None = None) -> TrialArm:
    """An arm of 20 steps with a median step time of ``ms``, its interval ``spread`` times it, ``activations``
    bytes (and 100 more of tensors in all)."""
    return TrialArm(label=label, steps=20, median_step_time_s=ms / 1000, step_time_low_s=spread[0] * ms / 1000,
                    step_time_high_s=spread[1] * ms / 1000, activations_bytes=activations,
                    tensor_bytes=activations + 100, losses=list(losses), error=None, others_cpu_percent=others)
