"""The memory view (M): the kinds as bars and the modules that saved the most, live (issue 14, app side)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fake_link import FakeLink, gpu, quiet_app, telemetry, training_events

from torchlab.core.wire import protocol
from torchlab.core.wire.payloads import MemoryBreakdown, ModuleBytes
from torchlab.tui.screens.memory_screen import TOP_MODULES, MemoryScreen

MIB = 2**20


def memory(step: int, activations_mib: float, modules: int = 3) -> protocol.Memory:
    by_module = [ModuleBytes(f"blocks.{i}.attn", int(activations_mib * MIB / modules)) for i in range(modules)]
    return protocol.Memory(breakdown=MemoryBreakdown(
        step=step, parameters_bytes=3 * MIB, gradients_bytes=3 * MIB, optimizer_bytes=6 * MIB,
        activations_bytes=sum(entry.bytes for entry in by_module), allocator_peak_bytes=None, by_module=by_module,
    ))


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
async def test_m_shows_the_kinds_as_bars_and_the_largest_modules_and_follows_new_figures(size) -> None:
    app = quiet_app(FakeLink(training_events() + [memory(100, 48)]))
    async with app.run_test(size=size) as pilot:
        app.poll_now()
        await pilot.pause()
        await pilot.press("M")
        assert isinstance(app.screen, MemoryScreen)
        kinds = str(app.screen.query_one("#memory-kinds").render())
        lines = kinds.splitlines()
        assert [line.split()[0] for line in lines] == ["parameters", "gradients", "optimizer", "activations", "total"]
        assert lines[3].count("█") == 40 and lines[2].count("█") == 5  # 6 MiB of the largest, 48 MiB, in 40 cells
        assert lines[3].endswith(" 48 MiB") and lines[4].endswith(" 60 MiB")
        assert max(len(line) for line in lines) <= size[0] - 4  # inside the frame
        table = app.screen.query_one("#memory-modules")
        assert [str(cell) for cell in table.get_column("module")] == ["blocks.0.attn", "blocks.1.attn", "blocks.2.attn"]
        assert "step 100" in str(app.screen.query_one("#memory-status").render())

        app.link.push(memory(200, 6))  # checkpointing switched on, say
        app.poll_now()
        await pilot.pause()
        assert "step 200" in str(app.screen.query_one("#memory-status").render())
        assert str(app.screen.query_one("#memory-kinds").render()).splitlines()[3].endswith(" 6 MiB")
        await pilot.press("M")
        assert not isinstance(app.screen, MemoryScreen)


async def test_before_any_measured_step_the_view_says_when_one_comes_and_long_lists_are_summed() -> None:
    app = quiet_app(FakeLink(training_events()))
    async with app.run_test(size=(80, 24)) as pilot:
        app.poll_now()
        await pilot.pause()
        await pilot.press("M")
        assert "No step has measured memory yet" in str(app.screen.query_one("#memory-status").render())
        app.link.push(memory(100, 100, modules=TOP_MODULES + 5))
        app.poll_now()
        await pilot.pause()
        rows = [str(cell) for cell in app.screen.query_one("#memory-modules").get_column("module")]
        assert len(rows) == TOP_MODULES + 1 and rows[-1] == "5 more modules"


async def test_on_cuda_the_view_adds_the_allocator_peak_and_what_nvml_sees_and_on_a_cpu_neither() -> None:
    on_gpu = replace(memory(100, 48), breakdown=replace(memory(100, 48).breakdown, allocator_peak_bytes=70 * MIB))
    app = quiet_app(FakeLink(training_events() + [telemetry(gpus=[gpu(0, this_run_memory_bytes=96 * MIB)]), on_gpu]))
    async with app.run_test(size=(80, 24)) as pilot:
        app.poll_now()
        await pilot.pause()
        await pilot.press("M")
        lines = str(app.screen.query_one("#memory-kinds").render()).splitlines()
        assert lines[5].startswith("allocator peak") and lines[5].endswith(" 70 MiB")
        assert lines[6].startswith("NVML: what the GPU holds for this run") and lines[6].endswith(" 96 MiB")
    app = quiet_app(FakeLink(training_events() + [telemetry(), memory(100, 48)]))  # a CPU: no allocator, no NVML
    async with app.run_test(size=(80, 24)) as pilot:
        app.poll_now()
        await pilot.pause()
        await pilot.press("M")
        lines = str(app.screen.query_one("#memory-kinds").render()).splitlines()
        assert lines[-1].startswith("total") and not any("NVML" in line or "peak" in line for line in lines)
