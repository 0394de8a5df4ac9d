"""Memory by kind: what the run's tensors hold (parameters, gradients, optimizer state, the activations
saved for backward) as bars, and the modules whose forward saved the most.

These are counted on the tensors themselves (core/engine/measure/memory.py), so they say what activation
checkpointing or AMP did on a CPU as on CUDA; the system view's RSS is the process as the OS sees it.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Label, Static

from torchlab.core.wire.payloads import MemoryBreakdown
from torchlab.tui.screens.view_screen import ViewScreen, closing_key
from torchlab.tui.state import RunState
from torchlab.core.units import format_bytes

#: The bars' widest, in cells.
BAR_WIDTH = 40
#: Modules listed, largest first.
TOP_MODULES = 30


def kind_bars(memory: MemoryBreakdown, width: int = BAR_WIDTH, nvml_bytes: int | None = None) -> Text:
    """One bar per kind, scaled to the largest, then the total; on CUDA, the allocator's peak and what NVML sees of
    the run (``TelemetrySample.run_gpu_memory_bytes``: the allocator's cache and CUDA's context too), where known."""
    kinds = (
        ("parameters", memory.parameters_bytes),
        ("gradients", memory.gradients_bytes),
        ("optimizer", memory.optimizer_bytes),
        ("activations", memory.activations_bytes),
    ) + ((("gathered", memory.gathered_bytes),) if memory.gathered_bytes else ())  # parallel=fsdp: parameters gathered whole
    largest = max(size for _, size in kinds) or 1
    text = Text()
    for name, size in kinds:
        cells = round(width * size / largest)
        text.append(f"{name:<12}")
        text.append("█" * cells, style="cyan")
        text.append(" " * (width - cells))
        text.append(f" {format_bytes(size):>9}\n")
    text.append(f"{'total':<12}{' ' * width} {format_bytes(memory.total_bytes):>9}", style="bold")
    if memory.allocator_peak_bytes is not None:
        text.append(f"\n{'allocator peak since the last option change':<{12 + width}} {format_bytes(memory.allocator_peak_bytes):>9}")
    if nvml_bytes is not None:
        text.append(f"\n{'NVML: what the GPU holds for this run':<{12 + width}} {format_bytes(nvml_bytes):>9}")
    return text


class MemoryScreen(ViewScreen):
    """The newest memory breakdown, live."""

    DEFAULT_CSS = """
    MemoryScreen #memory-kinds { height: auto; padding: 1 0 0 0; }
    MemoryScreen #memory-modules-title { padding: 1 0 0 0; text-style: bold; }
    """

    BINDINGS = [closing_key("M")]

    def compose(self) -> ComposeResult:
        with Vertical(id="view"):
            yield Label("", id="memory-status", classes="view-status")
            yield Static(id="memory-kinds")
            yield Label("activations by module (saved for backward in its own forward)", id="memory-modules-title")
            yield DataTable(id="memory-modules", cursor_type="row", zebra_stripes=True)
            yield Label("esc back · measured on a step about once a second (--memory-every); "
                        "checkpointed blocks count the inputs they keep", classes="view-keys")

    def on_mount(self) -> None:
        self.query_one("#view").border_title = "memory"
        table = self.query_one(DataTable)
        table.add_column("module", key="module")
        table.add_column(Text("saved", justify="right"), key="bytes")
        table.add_column(Text("share", justify="right"), key="share")
        self.show_state(self.state)

    def show_state(self, state: RunState) -> None:
        if state.memory_version == self._seen_version:
            return
        self._seen_version = state.memory_version
        memory = state.memory
        status = self.query_one("#memory-status", Label)
        kinds = self.query_one("#memory-kinds", Static)
        table = self.query_one(DataTable)
        table.clear()
        if memory is None:
            status.update("No step has measured memory yet (it is measured about once a second; --memory-every 0 turns it off).")
            kinds.update("")
            return
        whose = ""
        if state.world_size > 1:  # rank 0 measures; under fsdp it holds its shards, under ddp a whole copy as each rank
            held = "its shards" if state.options.get("parallel") == "fsdp" else "a whole copy, as each rank"
            whose = f" · rank 0 of {state.world_size}, {held}"
        status.update(f"step {memory.step} · the tensors training holds, each storage counted once{whose}")
        kinds.update(kind_bars(memory, nvml_bytes=state.telemetry.run_gpu_memory_bytes if state.telemetry else None))
        for entry in memory.by_module[:TOP_MODULES]:
            share = entry.bytes / memory.activations_bytes if memory.activations_bytes else 0.0
            table.add_row(entry.module, Text(format_bytes(entry.bytes), justify="right"), Text(f"{100 * share:.0f} %", justify="right"))
        hidden = len(memory.by_module) - TOP_MODULES
        if hidden > 0:
            rest = sum(entry.bytes for entry in memory.by_module[TOP_MODULES:])
            table.add_row(Text(f"{hidden} more modules", style="italic"), Text(format_bytes(rest), justify="right"), Text(""))
