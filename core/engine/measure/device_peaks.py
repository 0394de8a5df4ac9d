"""The common GPUs' peak FLOP/s, by the name CUDA and NVML give the device: what an MFU is held to on CUDA.

Each figure is the vendor's own (NVIDIA's datasheets, and its architecture whitepapers where a datasheet rounds),
**dense**: without 2:4 structured sparsity, which the datasheets' starred figures (twice these) assume and no
training step uses. A dtype's peak is the tensor cores' where its matrix products run on them: bf16 and fp16 (with
FP32 accumulation, as torch's matmuls use; a GeForce card's FP16-accumulate figure is twice it), and float32 as TF32
where torch lets it (``torch.backends.cuda.matmul.allow_tf32`` for matrix products, ``torch.backends.cudnn.allow_tf32``
for convolutions: on by default), else the CUDA cores' FP32.

A device not in the table, a MIG slice (a fraction of the SMs) or a laptop's part (lower clocks) has no peak here:
its MFU is left out rather than held to a wrong figure, unless the run is given one (``--peak-tflops``). The A10G,
AWS's variant of the A10, is left out for that reason: NVIDIA publishes no datasheet for it, and its tensor rate is
not the A10's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

TERA = 1e12


@dataclass(frozen=True)
class GpuPeaks:
    """A GPU's dense peak FLOP/s: its CUDA cores' float32, and its tensor cores' TF32, bf16 and fp16."""

    float32: float
    tf32: float
    bf16: float
    fp16: float

    def for_dtype(self, dtype: torch.dtype, tf32: bool) -> float | None:
        """The peak for ``dtype``'s products; float32's on the tensor cores where ``tf32`` lets them run there."""
        if dtype == torch.float32:
            return self.tf32 if tf32 else self.float32
        return {torch.bfloat16: self.bf16, torch.float16: self.fp16}.get(dtype)


def _tflops(float32: float, tf32: float, bf16: float, fp16: float | None = None) -> GpuPeaks:
    return GpuPeaks(float32 * TERA, tf32 * TERA, bf16 * TERA, (bf16 if fp16 is None else fp16) * TERA)


#: The first entry all of whose words are words of the device's name (case aside) is the device's: a variant's
#: before its family's ("H100 NVL" before "H100", whose entry is the SXM board's: "NVIDIA H100 80GB HBM3").
GPU_PEAKS: tuple[tuple[tuple[str, ...], GpuPeaks], ...] = (
    (("H100", "NVL"), _tflops(60, 417.5, 835.5)),  # H100 datasheet: 835 / 1,671 TFLOPS with sparsity
    (("H100", "PCIE"), _tflops(51.2, 378, 756)),  # Hopper whitepaper, H100 PCIe
    (("H100",), _tflops(66.9, 494.7, 989.4)),  # Hopper whitepaper, H100 SXM5
    (("H200", "NVL"), _tflops(60, 417.5, 835.5)),  # H200 datasheet, H200 NVL: the H100 NVL's
    (("H200",), _tflops(66.9, 494.7, 989.4)),  # H200 datasheet, H200 SXM: the H100 SXM's (989 / 1,979 with sparsity)
    (("A100",), _tflops(19.5, 156, 312)),  # A100 datasheet, SXM and PCIe, 40 and 80 GB alike
    (("L40S",), _tflops(91.6, 183, 362.05)),  # L40S datasheet
    (("L4",), _tflops(30.3, 60, 121)),  # L4 datasheet: 120 / 242 with sparsity
    (("A10",), _tflops(31.2, 62.5, 125)),  # A10 datasheet (not the A10G: its words differ)
    (("RTX", "4090"), _tflops(82.6, 82.6, 165.2)),  # Ada whitepaper, GeForce RTX 4090: FP32 accumulate
)
#: Words of a name that make it another device than its family's entry says: a MIG slice, a laptop's part, the D.
_UNLIKE = frozenset({"MIG", "LAPTOP", "MOBILE", "MAX", "D"})


def gpu_peaks(name: str) -> GpuPeaks | None:
    """The peaks of the GPU named ``name`` (``torch.cuda.get_device_name``, NVML's name alike), or None where the
    table has no entry for it."""
    words = set(re.split(r"[^0-9A-Z]+", name.upper()))
    if words & _UNLIKE:
        return None
    return next((peaks for family, peaks in GPU_PEAKS if words.issuperset(family)), None)


def cuda_peak(name: str, dtype: torch.dtype, convolution_share: float) -> float | None:
    """The peak FLOP/s of steps of ``dtype`` on the GPU named ``name``, ``convolution_share`` of whose FLOPs are
    convolutions': the FLOP/s at which the steps' FLOPs would take the least time, each kind at its own peak (a
    float32 product as TF32 where torch's switch for its kind lets it). None where the GPU is not in the table."""
    peaks = gpu_peaks(name)
    if peaks is None:
        return None
    products = peaks.for_dtype(dtype, torch.backends.cuda.matmul.allow_tf32)
    convolutions = peaks.for_dtype(dtype, torch.backends.cudnn.allow_tf32)
    if products is None or convolutions is None:
        return None
    return 1 / (convolution_share / convolutions + (1 - convolution_share) / products)
