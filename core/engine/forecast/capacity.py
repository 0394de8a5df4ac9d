"""The memory a rank must fit in, and whether a predicted peak fits it: ``torchlab-tui plan``'s verdicts and the OOM
rescue's choice of a rung (core/engine/guards/rescue_forecast.py). Torch-free: plan reads ``--device-memory``
before torch loads."""

from __future__ import annotations

from dataclasses import dataclass

#: A peak under this share of the memory fits; the rest is left for what the forecast does not model.
FITS_SHARE = 0.9


@dataclass(frozen=True)
class Capacity:
    """The memory a rank must fit in: ``shared`` by all ranks (a CPU's RAM) or each rank's own (a GPU's)."""

    bytes: int
    shared: bool
    source: str

    def room(self, world_size: int) -> int:
        return self.bytes // world_size if self.shared else self.bytes

    def verdict(self, peak: int, world_size: int) -> str:
        room = self.room(world_size)
        return "yes" if peak <= FITS_SHARE * room else "tight" if peak <= room else "no"
