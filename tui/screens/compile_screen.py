"""What torch.compile did (``K``): its graphs and compile time, what compiling bought (the impact row of the segment
compile came on in), each graph break at its file and line with its code, Dynamo's reason, explanation and hint,
and each recompile with the guard that failed and the fix where it is mechanical (core/engine/compile_watch.py,
core/analysis/compile_payback.py; docs/options.md).
"""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.padding import Padding
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Label, Static

from torchlab.core.options import COMPILE, DYNAMIC
from torchlab.core.wire.compile_report import CompileReport, eager_sentence, short_path
from torchlab.core.wire.payloads import ImpactSegment
from torchlab.tui.screens.view_screen import ViewScreen, closing_key
from torchlab.tui.state import RunState


def compile_text(report: CompileReport, bought: ImpactSegment | None) -> Group:
    """The report as the view shows it: what compiling bought, then the breaks, then the recompiles; each entry's lines
    indented under it, wrapped lines too."""
    lines: list[RenderableType] = []

    def indented(text: str, style: str = "") -> None:
        lines.append(Padding(Text(text, style=style), (0, 0, 0, 4)))

    if bought is not None:
        lines.append(Text(f"{bought.verdict} (steps {bought.first_step}–{bought.last_step})\n"))
    if report.unseen:
        lines.append(Text(f"{report.unseen}\n", style="yellow"))
    if report.eager_ops is not None:
        lines.append(Text.assemble(("eager between graphs: ", "bold"), f"{eager_sentence(report)}\n"))
    breaks = len(report.breaks) or ("none" if report.sees_breaks else "not reported")
    lines.append(Text.assemble((f"graph breaks: {breaks}", "bold"),
                               " (the code between two graphs runs eagerly)" if report.breaks else ""))
    for entry in report.breaks:
        lines.append(Text.assemble((f"{short_path(entry.file)}:{entry.line}", "bold yellow"),
                                   f"  {entry.reason}" + (f" ({entry.count} compiles met it)" if entry.count > 1 else "")))
        if entry.code:
            indented(entry.code, "cyan")
        for line in (entry.explanation, entry.hint and f"hint: {entry.hint}"):
            if line:
                indented(line, "dim")
    lines.append(Text.assemble(("\nrecompiles: " + str(len(report.recompiles) or "none"), "bold"),
                               f" (torch's limit: {report.recompile_limit} graphs a frame, then it runs eagerly; shapes: "
                               f"{DYNAMIC.name}={report.dynamic})"))
    for entry in report.recompiles:
        lines.append(Text.assemble((f"{entry.frame} ({short_path(entry.file)}:{entry.line})", "bold yellow"),
                                   f"  {entry.count}x, {entry.compiled} graphs now"))
        indented(f"guard failed: {entry.guard}")
        if entry.hint:
            indented(entry.hint, "dim")
    return Group(*lines)


def compile_row(impact: list[ImpactSegment]) -> ImpactSegment | None:
    """The newest impact row compile came on in, where the table says what it bought."""
    return next((row for row in reversed(impact) if "compile=on" in row.change and "compiled in" in row.verdict), None)


class CompileScreen(ViewScreen):
    """What torch.compile did, live."""

    DEFAULT_CSS = """
    CompileScreen #compile-body { height: 1fr; }
    """

    BINDINGS = [closing_key("K")]

    def compose(self) -> ComposeResult:
        with Vertical(id="view"):
            yield Label("", id="compile-status", classes="view-status")
            with VerticalScroll(id="compile-body"):
                yield Static(id="compile-report")
            yield Label(f"esc back; there {COMPILE.key} switches compile, {DYNAMIC.key} its shapes, i opens the impact "
                        "table", classes="view-keys")

    def on_mount(self) -> None:
        self.query_one("#view").border_title = "torch.compile"
        self.show_state(self.state)

    def show_state(self, state: RunState) -> None:
        version = (state.compile_version, state.impact_version)
        if version == self._seen_version:
            return
        self._seen_version = version  # type: ignore[assignment]
        report, status = state.compile_report, self.query_one("#compile-status", Label)
        body = self.query_one("#compile-report", Static)
        if report is None:
            status.update("Nothing compiled in this run's trainer yet: C compiles the model at the next step boundary.")
            body.update("")
            return
        on = "on" if state.options.get("compile") else "off now"
        status.update(f"compile {on} · {report.graphs} graph{'s' if report.graphs != 1 else ''}, "
                      f"{report.compile_s:.1f} s compiling (as of step {report.step}; watching it took "
                      f"{report.watch_s * 1000:.0f} ms)")
        body.update(compile_text(report, compile_row(state.impact)))
