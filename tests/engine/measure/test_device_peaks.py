"""The common GPUs' peaks by the name CUDA and NVML give them (core/engine/measure/device_peaks.py): a variant's
entry before its family's, a MIG slice or a laptop's part none; float32 held to TF32's peak where torch lets its
products run as TF32, convolutions to theirs by cuDNN's own switch."""

from __future__ import annotations

import pytest
import torch

from torchlab.core.engine.measure.device_peaks import TERA, cuda_peak, gpu_peaks


@pytest.mark.parametrize("name, bf16_tflops", [
    ("NVIDIA H100 80GB HBM3", 989.4), ("NVIDIA H100 PCIe", 756), ("NVIDIA H100 NVL", 835.5), ("NVIDIA H200", 989.4),
    ("NVIDIA H200 NVL", 835.5), ("NVIDIA A100-SXM4-80GB", 312), ("NVIDIA A100 80GB PCIe", 312),
    ("NVIDIA A100-PCIE-40GB", 312), ("NVIDIA L4", 121), ("NVIDIA L40S", 362.05), ("NVIDIA A10", 125),
    ("NVIDIA GeForce RTX 4090", 165.2),
])
def test_each_common_gpu_has_its_datasheets_dense_bf16_peak(name, bf16_tflops):
    assert gpu_peaks(name).bf16 == bf16_tflops * TERA


@pytest.mark.parametrize("name", ["NVIDIA A10G", "NVIDIA L40", "NVIDIA A100-SXM4-40GB MIG 1g.5gb",
                                  "NVIDIA GeForce RTX 4090 Laptop GPU", "NVIDIA GeForce RTX 4090 D", "Tesla V100-SXM2-16GB"])
def test_a_gpu_the_table_cannot_vouch_for_has_no_peak(name):
    assert gpu_peaks(name) is None and cuda_peak(name, torch.bfloat16, 0.0) is None


@pytest.fixture
def tf32_switches():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def test_float32_is_held_to_tf32s_peak_where_torch_lets_each_kind_of_op_run_as_tf32(tf32_switches):
    h100 = gpu_peaks("NVIDIA H100 80GB HBM3")
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = False, True  # torch's defaults
    assert cuda_peak("NVIDIA H100 80GB HBM3", torch.float32, 0.0) == pytest.approx(h100.float32)
    assert cuda_peak("NVIDIA H100 80GB HBM3", torch.float32, 1.0) == pytest.approx(h100.tf32)
    half = cuda_peak("NVIDIA H100 80GB HBM3", torch.float32, 0.5)  # each half at its own peak
    assert half == pytest.approx(1 / (0.5 / h100.tf32 + 0.5 / h100.float32))
    torch.backends.cuda.matmul.allow_tf32 = True
    assert cuda_peak("NVIDIA H100 80GB HBM3", torch.float32, 0.0) == pytest.approx(h100.tf32)
    assert cuda_peak("NVIDIA H100 80GB HBM3", torch.bfloat16, 0.5) == pytest.approx(h100.bf16)
