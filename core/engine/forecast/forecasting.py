"""The plan's side that imports torch: the workload built without its weights, its forecast, the memory of this
machine, and what the figures leave out (core/launch/plan.py prints them)."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import psutil
import torch

from torchlab.core.engine.adapters.loading import load_workload, workload_label
from torchlab.core.engine.forecast.fake_twin import parameters_on_meta
from torchlab.core.engine.forecast.for_workload import largest_batch, workload_forecast
from torchlab.core.engine.forecast.memory_forecast import MemoryForecast
from torchlab.core.engine.forecast.step_shape import StepShape, candidate_shapes, configured_shape
from torchlab.core.engine.parts import DEFAULT_BATCH_SIZE, resolve_device
from torchlab.core.engine.seeding import seed_everything
from torchlab.core.errors import ConfigError, ForecastError, WorkloadError
from torchlab.core.engine.forecast.capacity import FITS_SHARE, Capacity
from torchlab.core.records.config import TrainConfig
from torchlab.core.records.starting_values import starting_configuration
from torchlab.core.units import format_bytes
from torchlab.core.wire.payloads import FIRST_BATCH, NOT_MODELLED, MemoryPrediction


@dataclass
class Forecasting:
    """One workload's forecast under the configuration the plan was given (with the workload's own settings)."""

    config: TrainConfig
    forecast: MemoryForecast
    configured: StepShape
    device: torch.device
    factory_s: float
    #: why the workload's factory could not build its model without its weights, which it then held (None: it did)
    weights_held: str | None = None
    #: the workload's own settings give its batch for the ranks it runs on (``candidate_shapes``)
    batch_per_rank: bool = False

    @classmethod
    def load(cls, config: TrainConfig, explicit: set[str]) -> Forecasting:
        """``config`` as ``resolve_config`` made it, with ``explicit`` the settings the user gave (a workload's own
        settings take the place of the others)."""
        device = resolve_device(config.device)
        seed_everything(config.seed)
        started = time.perf_counter()
        try:
            with parameters_on_meta():
                workload = load_workload(config.workload)
            held = None
        except WorkloadError as on_meta:  # a factory that moves or reads its weights (a transformers Trainer: .to())
            workload = load_workload(config.workload)
            held = str(on_meta).split(": ", 1)[-1].split(";")[0][:200]  # its first clause: what the factory tried
        factory_s = time.perf_counter() - started
        config, _ = starting_configuration(config, workload.settings, explicit)
        batch_size = config.batch_size or workload.batch_size or DEFAULT_BATCH_SIZE
        batch_per_rank = "batch_size" in (workload.settings or {}) and "batch_size" not in explicit
        if batch_per_rank:  # the factory gave the batch of one process (no WORLD_SIZE here); its ranks take as much each
            batch_size *= config.options.world_size
        return cls(config, workload_forecast(workload, config, device), configured_shape(config.options, batch_size, config.reshard_after_forward), device,
                   factory_s, held, batch_per_rank)

    def candidates(self, gpus: int | None) -> list[tuple[str, StepShape]]:
        return candidate_shapes(self.configured, gpus, self.batch_per_rank)

    def predict(self, shape: StepShape, longest: list[list[int]] | None = None,
                ) -> tuple[MemoryPrediction | None, ForecastError | ConfigError | None]:
        """The prediction (with a live run's ``longest`` batch: ``MemoryForecast.predict``), or why this candidate
        cannot be predicted (FSDP2 refusing a tied weight across blocks)."""
        try:
            return self.forecast.predict(shape, longest), None
        except (ForecastError, ConfigError) as cannot:
            return None, cannot

    def largest_batch(self, capacity: Capacity) -> tuple[str, StepShape] | None:
        """The largest batch predicted to fit (``for_workload.largest_batch``: the line through the configured batch
        and twice it), as a candidate to predict; None where the two cannot say or it is one of them already."""
        configured = self.configured
        doubled = dataclasses.replace(configured, batch_size=2 * configured.batch_size)
        predicted, twice = self.predict(configured)[0], self.predict(doubled)[0]
        if predicted is None or twice is None or predicted.refused or twice.refused:
            return None
        limit = int(FITS_SHARE * capacity.room(configured.world_size))
        batch = largest_batch(configured, predicted, twice, limit)
        if batch is None or batch in (configured.batch_size, doubled.batch_size):
            return None
        return f"largest batch that fits: batch_size={batch}", dataclasses.replace(configured, batch_size=batch)

    def capacity(self) -> Capacity:
        if self.device.type == "cuda":
            total = torch.cuda.get_device_properties(self.device).total_memory
            gpu = torch.cuda.get_device_name(self.device)
            return Capacity(total, shared=False,
                            source=f"{format_bytes(total)} per rank ({gpu}; --device-memory plans for another)")
        available = psutil.virtual_memory().available
        return Capacity(available, shared=True, source=f"{format_bytes(available)} of RAM available now, shared by the "
                                                       f"ranks (--device-memory plans for a GPU's)")

    def heading(self) -> str:
        shape = self.configured
        ranks = f"{shape.world_size} ranks ({shape.parallel})" if shape.world_size > 1 else "1 rank"
        return (f"torchlab-tui plan: {workload_label(self.config.workload)} on {self.device.type}, batch "
                f"{shape.batch_size}, {ranks}; predicted on fake tensors, nothing trained")

    def footnotes(self) -> str:
        """What the figures leave out, and how the model was built for them."""
        notes = f"{NOT_MODELLED[0].upper()}{NOT_MODELLED[1:]}; {FIRST_BATCH}"
        notes += "; on a CPU, the CPU's autocast stands in for CUDA's (plan on the GPU box for its own)." if (
            self.device.type == "cpu") else "."
        if self.weights_held is None:
            return f"{notes} The workload's factory took {self.factory_s:.1f} s; its weights were never held."
        weights = sum(parameter.numel() * parameter.element_size() for parameter in self.forecast.model.parameters())
        return (f"{notes} The workload's factory could not build its model without its weights ({self.weights_held}): "
                f"it was built whole, {format_bytes(weights)} held, in {self.factory_s:.1f} s.")
