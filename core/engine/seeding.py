"""Seeding before a workload is built, so that model initialisation is reproducible."""

from __future__ import annotations

import random

import torch


def seed_everything(seed: int) -> None:
    """Python's, torch's and (if installed) numpy's generators: call it before the workload factory runs."""
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy
    except ImportError:
        return
    numpy.random.seed(seed)
