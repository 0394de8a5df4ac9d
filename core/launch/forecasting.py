"""The plan's side that imports torch: the workload built without its weights, its forecast, the memory of this
machine, and what the figures leave out (core/launch/plan.py prints them)."""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import psutil
import torch

from torchlab.core.engine.adapters.loading import load_workload, workload_label
from torchlab.core.engine.forecast.fake_twin import parameters_on_meta
from torchlab.core.engine.forecast.for_workload import candidate_shapes, configured_shape, workload_forecast
from torchlab.core.engine.forecast.memory_forecast import NOT_MODELLED, MemoryForecast, StepShape
from torchlab.core.engine.parts import DEFAULT_BATCH_SIZE, resolve_device
from torchlab.core.engine.seeding import seed_everything
from torchlab.core.errors import ConfigError, ForecastError
from torchlab.core.launch.arguments import explicit_names, setting_layers
from torchlab.core.launch.capacity import Capacity
from torchlab.core.records.config import TrainConfig
from torchlab.core.records.starting_values import starting_configuration
from torchlab.core.units import format_bytes
from torchlab.core.wire.payloads import MemoryPrediction


@dataclass
class Forecasting:
    """One workload's forecast under the configuration the plan was given (with the workload's own settings)."""

    config: TrainConfig
    forecast: MemoryForecast
    configured: StepShape
    device: torch.device
    factory_s: float

    @classmethod
    def load(cls, config: TrainConfig, args: argparse.Namespace) -> Forecasting:
        device = resolve_device(config.device)
        seed_everything(config.seed)
        started = time.perf_counter()
        with parameters_on_meta():
            workload = load_workload(config.workload)
        factory_s = time.perf_counter() - started
        config, _ = starting_configuration(config, workload.settings, explicit_names(*setting_layers(args)))
        batch_size = config.batch_size or workload.batch_size or DEFAULT_BATCH_SIZE
        return cls(config, workload_forecast(workload, config, device), configured_shape(config, batch_size), device,
                   factory_s)

    def candidates(self, gpus: int | None) -> list[tuple[str, StepShape]]:
        return candidate_shapes(self.configured, gpus)

    def predict(self, shape: StepShape) -> tuple[MemoryPrediction | None, ForecastError | ConfigError | None]:
        """The prediction, or why this candidate cannot be predicted (FSDP2 refusing a tied weight across blocks)."""
        try:
            return self.forecast.predict(shape), None
        except (ForecastError, ConfigError) as cannot:
            return None, cannot

    def capacity(self) -> Capacity:
        if self.device.type == "cuda":
            total = torch.cuda.get_device_properties(self.device).total_memory
            gpu = torch.cuda.get_device_name(self.device)
            return Capacity(total, shared=False,
                            source=f"{format_bytes(total)} per rank ({gpu}; --device-memory plans for another)")
        available = psutil.virtual_memory().available
        return Capacity(available, shared=True, source=f"{format_bytes(available)} of RAM available now, shared by the "
                                                       f"ranks (--device-memory plans for a GPU's)")

    def heading(self, seconds: float) -> str:
        shape = self.configured
        ranks = f"{shape.world_size} ranks ({shape.parallel})" if shape.world_size > 1 else "1 rank"
        return (f"torchlab-tui plan: {workload_label(self.config.workload)} on {self.device.type}, batch "
                f"{shape.batch_size}, {ranks}: predicted on fake tensors in {seconds:.1f} s, nothing trained")

    def footnotes(self) -> list[str]:
        notes = [f"{NOT_MODELLED[0].upper()}{NOT_MODELLED[1:]}."]
        if self.device.type == "cpu":
            notes.append("Predicted with the CPU's autocast, whose op lists are close to CUDA's; run plan on the GPU "
                         "box for CUDA's own.")
        notes.append(f"The workload's factory took {self.factory_s:.1f} s (its data is made as it is; its weights were "
                     f"never held).")
        return notes



