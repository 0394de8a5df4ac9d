"""What the hardware is doing: per-GPU memory and utilisation, temperature and power, host CPU and RAM,
the trainer's RSS, and a short memory history; where there is room (the full-size view, ``t``), the run's
disk reads and writes, a bar per core, and the run's processes with their CPU, RSS and disk rates.

Drawn from the newest telemetry sample and the state's bounded history of them, at whatever size the
panel has: one line per figure in a bordered panel, one GPU per line when several GPUs would not fit
otherwise, or a single summary line (``compact``) on a small terminal. Any figure the trainer could
not read arrives as None and reads "n/a"; a box without NVIDIA says why, in place of the GPU lines.
A sample from before the trainer took cores and processes (an older run's) shows the lines it has.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from torchlab.core.wire.payloads import (
    NO_GPU,
    AllocatorSample,
    GpuSample,
    HostSample,
    ProcessSample,
    TelemetrySample,
    why_no_gpu,
)
from torchlab.tui.formatting import SPARK_CHARS, fit_parts
from torchlab.tui.state import RunState
from torchlab.core.units import byte_unit, format_bytes, three_digits

PARTIAL_BLOCKS = " ▏▎▍▌▋▊▉"
#: Width of the label column ("mem", "util", "alloc", ...).
LABEL_WIDTH = 6
#: Bars never grow past this, however wide the panel: the figures beside them matter more.
MAX_BAR_WIDTH = 40
#: The widest figure a bar has beside it (" 121.0/125.7 GiB"): a narrow panel shortens the bar, not the figure.
FIGURE_WIDTH = 16
NA = "n/a"
#: Utilisation bars are not a warning when full (a busy GPU is the point): one colour, whatever the level.
BUSY_STYLE = "bold cyan"
#: The RSS history is drawn between its low and high, but over at least this fraction of the high.
MIN_RSS_SPAN = 0.05
#: A core's bar is at most this wide; cores go side by side while theirs stay comfortable, and closer where rows
#: are few, down to the narrowest: below it, each core is one ▁..█ cell.
MAX_CORE_BAR = 20
COMFORTABLE_CORE_BAR = 10
MIN_CORE_BAR = 4
MAX_CORE_COLUMNS = 4
#: The process table's figures after its pid and name: (title, width).
PROCESS_COLUMNS = (("cpu", 6), ("rss", 10), ("read/s", 12), ("write/s", 12))
#: Cells of cores side by side are this far apart.
CORE_GAP = 3


class SystemPanel(Widget):
    """GPUs (or why there are none), host CPU/RAM, trainer RSS and processes, memory history."""

    DEFAULT_CSS = """
    SystemPanel {
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    """

    compact: reactive[bool] = reactive(False)
    """One summary line instead of the panel: for small terminals."""

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._state: RunState | None = None

    def show(self, state: RunState) -> None:
        """Redraw from the run state (the app calls this when a new telemetry sample arrived)."""
        self._state = state
        self.refresh()

    def render(self) -> Text:
        state = self._state
        sample = state.telemetry if state is not None else None
        history = list(state.telemetry_history) if state is not None else []
        width = max(self.content_size.width, 10)
        if self.compact:
            return summary_line(sample, width)
        return panel_text(sample, history, width, self.content_size.height)


# ---------------------------------------------------------------------- the full panel

def panel_text(sample: TelemetrySample | None, history: Sequence[TelemetrySample], width: int, height: int) -> Text:
    """The panel's lines for a ``width`` x ``height`` area (lines past ``height`` are dropped by the widget).

    Each line is built of parts, most important first, and keeps those that fit: a figure is left out
    whole, never cut in the middle (``trai…``)."""
    if sample is None:
        return Text("waiting for the first system sample…", style="dim italic")
    gpus = sample.gpus
    # Bars take under half the width: the figures after them (" 40.7/79.6 GiB · run 40.1 GiB") must fit, the
    # first of them (" 21.0/125.7 GiB") beside the bar however narrow the panel.
    bar_width = max(4, min(MAX_BAR_WIDTH, int((width - LABEL_WIDTH) * 0.45), width - LABEL_WIDTH - FIGURE_WIDTH))
    lines: list[list[Text]] = []
    host_lines = _host_lines(sample.host, sample.torch, bar_width)
    history_line = _history_line(gpus, history, max(bar_width, width - LABEL_WIDTH - 28))
    if gpus:
        room = max(height, 1) - len(host_lines) - 1  # lines left for the GPUs, after host figures and the history
        if len(gpus) == 1 or 3 * len(gpus) <= room:
            for gpu in gpus:
                lines += _gpu_lines(gpu, bar_width)
        elif len(gpus) <= room:
            lines += [_gpu_line(gpu, width) for gpu in gpus]
        else:
            lines += _gpus_summary_lines(gpus)
    else:
        lines.append([Text(NO_GPU, style="bold yellow"), Text(f": {why_no_gpu(sample.gpu_status)}", style="yellow")])
    lines.append(history_line)
    lines += host_lines
    lines += _detail_lines(sample.host, width, max(height, 1) - len(lines))
    return Text("\n").join(fit_parts(parts, width) for parts in lines)


def _gpu_lines(gpu: GpuSample, bar_width: int) -> list[list[Text]]:
    """Three lines for one GPU: name with temperature, power and clock; memory bar; utilisation bar."""
    used, total = gpu.memory_used_bytes, gpu.memory_total_bytes
    utilisation = gpu.utilization_percent
    title = Text.assemble((f"GPU{gpu.index} ", "bold"), (gpu.name or "unnamed GPU", "bold"))
    memory = _labelled_bar("mem", _fraction(used, total), bar_width)
    memory.append(f" {_pair(used, total)}")
    run = [Text(f" · run {format_bytes(gpu.this_run_memory_bytes)}", style="dim")] if gpu.this_run_memory_bytes is not None else []
    util = _labelled_bar("util", None if utilisation is None else utilisation / 100, bar_width, BUSY_STYLE)
    util.append(f" {_percent(utilisation)}")
    return [
        [title, Text(f"  {_temperature(gpu)}"), Text(f"  {_power(gpu)}"), Text(f"  {_clock(gpu)}")],
        [memory, *run],
        [util],
    ]


def _gpu_line(gpu: GpuSample, width: int) -> list[Text]:
    """One line for one GPU of several: ``0 mem ▆▆▆░░ 41/80 GiB  util ▇▇░ 87 %  62°C 312 W``."""
    used, total = gpu.memory_used_bytes, gpu.memory_total_bytes
    utilisation = gpu.utilization_percent
    small_bar = max(3, min(12, (width - 44) // 2))
    memory = Text(f"{gpu.index} ", style="bold")
    memory.append_text(_bar(_fraction(used, total), small_bar))
    memory.append(f" {_pair(used, total)}")
    util = Text("  ")
    util.append_text(_bar(None if utilisation is None else utilisation / 100, small_bar, BUSY_STYLE))
    util.append(f" {_percent(utilisation)}")
    return [memory, util, Text(f"  {_temperature(gpu)}"), Text(f" {_power(gpu, with_limit=False)}")]


def _gpus_summary_lines(gpus: list[GpuSample]) -> list[list[Text]]:
    """Too many GPUs for a line each: totals, then utilisation per GPU in one line."""
    used = _sum(gpu.memory_used_bytes for gpu in gpus)
    total = _sum(gpu.memory_total_bytes for gpu in gpus)
    utilisations = [gpu.utilization_percent for gpu in gpus]
    known = [value for value in utilisations if value is not None]
    temperatures = [gpu.temperature_c for gpu in gpus if gpu.temperature_c is not None]
    powers = [gpu.power_w for gpu in gpus if gpu.power_w is not None]
    head = [
        Text.assemble((f"{len(gpus)} GPUs ", "bold"), f"mem {_pair(used, total)}"),
        Text(f"  util avg {_percent(sum(known) / len(known) if known else None)}"),
        Text(f"  max {max(temperatures):.0f}°C" if temperatures else f"  {NA} °C"),
        Text(f"  {sum(powers):.0f} W" if powers else f"  {NA} W"),
    ]
    per_gpu = [Text("util", style="dim")]
    per_gpu += [Text(f" {gpu.index}:{_percent(value, unit='%')}") for gpu, value in zip(gpus, utilisations)]
    return [head, per_gpu]


def _host_lines(host: HostSample, allocator: AllocatorSample, bar_width: int) -> list[list[Text]]:
    cpu_line = _labelled_bar("cpu", host.cpu_percent / 100, bar_width, BUSY_STYLE)
    cpu_line.append(f" {_percent(host.cpu_percent)}")
    if host.cpu_count is not None:
        cpu_line.append(f" of {host.cpu_count:.0f}", style="dim")
    cpu = [cpu_line, Text(f" · trainer {host.trainer_cpu_percent:.0f} %", style="dim")]
    used, total = host.ram_used_bytes, host.ram_total_bytes
    ram_line = _labelled_bar("ram", _fraction(used, total), bar_width)
    ram_line.append(f" {_pair(used, total)}")
    processes = host.trainer_processes
    rss = Text("rss".ljust(LABEL_WIDTH), style="dim")
    rss.append(format_bytes(host.trainer_rss_bytes, missing=NA), style="bold")
    trainer = [rss, Text(f" · {processes:.0f} process{'es' if processes != 1 else ''}")]
    if allocator.allocated_bytes is None:  # no CUDA allocator (a CPU run): one line says so, beside the RSS
        device = allocator.device
        trainer.append(Text(f" · alloc {NA}" + (f" on {device}" if device else ""), style="dim"))
        return [cpu, [ram_line], trainer]
    alloc = Text("alloc".ljust(LABEL_WIDTH), style="dim")
    alloc.append(format_bytes(allocator.allocated_bytes), style="bold")
    return [cpu, [ram_line], trainer, [
        alloc,
        Text(f" · reserved {format_bytes(allocator.reserved_bytes, missing=NA)}"),
        Text(f" · peak {format_bytes(allocator.peak_allocated_bytes, missing=NA)}"),
    ]]


def _detail_lines(host: HostSample, width: int, room: int) -> list[list[Text]]:
    """What fills the rows left (``room``): the run's disk rates, a bar per core, then the run's processes; the
    cores take at most half the rows when processes follow, so both show."""
    lines: list[list[Text]] = []
    if room >= 1 and (host.io_read_bytes_per_s is not None or host.io_write_bytes_per_s is not None):
        disk = Text("disk".ljust(LABEL_WIDTH), style="dim")
        disk.append(f"read {_rate(host.io_read_bytes_per_s)}")
        lines.append([disk, Text(f" · write {_rate(host.io_write_bytes_per_s)}"), Text(" · the run's processes", style="dim")])
    room -= len(lines)
    if host.cpu_percent_per_core and room >= 1:
        cores = _core_lines(host.cpu_percent_per_core, width, room // 2 if host.processes and room >= 4 else room)
        lines += cores
        room -= len(cores)
    if host.processes and room >= 2:
        lines += _process_lines(host.processes, host.trainer_processes, room)
    return lines


def _core_lines(loads: Sequence[float], width: int, rows: int) -> list[list[Text]]:
    """A bar per core (``0 ████░░ 95 %   1 █░░░░░ 12 %``), up to four side by side while the bars stay readable (as
    htop lays them out), more where ``rows`` are few; where even the narrowest bars do not fit, one ▁..█ cell per
    core."""
    digits = len(str(len(loads) - 1))
    room = width - LABEL_WIDTH

    def bar_width(columns: int) -> int:  # a cell is "NN " + bar + " 100 %"
        return min(MAX_CORE_BAR, (room - (columns - 1) * CORE_GAP) // columns - digits - 7)

    comfortable = [count for count in range(1, min(len(loads), MAX_CORE_COLUMNS) + 1) if bar_width(count) >= COMFORTABLE_CORE_BAR]
    columns = max(comfortable, default=1)
    while -(-len(loads) // columns) > rows and columns < len(loads) and bar_width(columns + 1) >= MIN_CORE_BAR:
        columns += 1
    per_column = -(-len(loads) // columns)
    if bar_width(columns) >= MIN_CORE_BAR and per_column <= rows:
        return [[_core_row(loads, range(row, len(loads), per_column), digits, bar_width(columns), label=row == 0)]
                for row in range(per_column)]
    per_line = max(1, room)
    return [[Text("cores".ljust(LABEL_WIDTH) if start == 0 else " " * LABEL_WIDTH, style="dim"),
             Text(spark(loads[start:start + per_line], 0.0, 100.0), style=BUSY_STYLE)]
            for start in range(0, len(loads), per_line)][:max(rows, 1)]


def _core_row(loads: Sequence[float], indices: Sequence[int], digits: int, bar: int, label: bool) -> Text:
    line = Text("cores".ljust(LABEL_WIDTH) if label else " " * LABEL_WIDTH, style="dim")
    for position, index in enumerate(indices):
        if position:
            line.append(" " * CORE_GAP)
        line.append(f"{index:>{digits}} ", style="dim")
        line.append_text(_bar(loads[index] / 100, bar, BUSY_STYLE))
        line.append(f" {loads[index]:>3.0f} %")
    return line


def _process_lines(processes: Sequence[ProcessSample], count: int, rows: int) -> list[list[Text]]:
    """A header, then a row per process of the run (the trainer first, then the busiest), as many as ``rows``
    hold; the last row says how many more there are (``count`` is all of the run's, listed or not). A narrow
    panel leaves out whole columns, the disk rates first."""
    everyone = len(processes) == count and count <= rows - 1
    shown = list(processes) if everyone else list(processes)[:max(0, rows - 2)]
    if not shown:  # a header over "+3 more": the rss line says as much
        return []
    lines = [[Text(f"{'pid':>7}  {'process':<14}", style="dim"), *(Text(f"{title:>{width}}", style="dim")
                                                                   for title, width in PROCESS_COLUMNS)]]
    for process in shown:
        name = process.name if len(process.name) <= 14 else process.name[:13] + "…"
        figures = (_percent(process.cpu_percent), format_bytes(process.rss_bytes, missing=NA),
                   _rate(process.read_bytes_per_s), _rate(process.write_bytes_per_s))
        lines.append([Text.assemble((f"{process.pid:>7}  ", "dim"), (f"{name:<14}", "bold")),
                      *(Text(f"{figure:>{width}}") for figure, (_, width) in zip(figures, PROCESS_COLUMNS))])
    if len(shown) < count:
        lines.append([Text(f"{'':>7}  +{count - len(shown)} more of the run's {count} processes", style="dim")])
    return lines


def _history_line(gpus: list[GpuSample], history: Sequence[TelemetrySample], room: int) -> list[Text]:
    """GPU memory used over the last samples, from 0 to the GPUs' total (so the headroom shows); without
    GPUs, the trainer's RSS between its own low and high (so growth shows)."""
    line = Text("hist".ljust(LABEL_WIDTH), style="dim")
    recent = list(history)[-room:]
    if gpus:
        values = [_sum(gpu.memory_used_bytes for gpu in sample.gpus) for sample in recent]
        totals = [_sum(gpu.memory_total_bytes for gpu in sample.gpus) for sample in recent]
        ceiling = max((value for value in totals if value), default=None)
        line.append(spark(values, 0.0, ceiling), style="cyan")
        what = " GPU mem"
    else:
        values = [sample.host.trainer_rss_bytes for sample in recent]
        low, high = (min(values), max(values)) if values else (None, None)
        what = f" rss {_range(low, high)}" if low is not None and high is not None and _range(low, high) != _range(high, high) else " rss"
        if low is not None and high is not None:
            low = min(low, high * (1 - MIN_RSS_SPAN))  # a change of a few pages must not draw as ▁ to █
        line.append(spark(values, low, high), style="cyan")
    span = _span_s(recent)
    return [line, Text(what + (f", {_duration(span)}" if span else ""), style="dim")]


# ---------------------------------------------------------------------- one line for small terminals

def summary_line(sample: TelemetrySample | None, width: int) -> Text:
    """``gpu0 41.2/79.6 GiB 87 % 62°C · cpu 23 % · ram 5.1/15.6 GiB · rss 812 MiB``, or ``no GPU · cpu …``
    (why there is none comes last, where it fits: ``t`` shows it in full); whole figures only."""
    if sample is None:
        return Text("system: waiting for the first sample…", style="dim italic")
    gpus, host = sample.gpus, sample.host
    parts: list[Text] = []
    if not gpus:
        parts.append(Text(NO_GPU, style="bold yellow"))
    elif len(gpus) <= 2:
        for gpu in gpus:
            gpu_used, gpu_total = gpu.memory_used_bytes, gpu.memory_total_bytes
            part = Text(f"gpu{gpu.index} ", style="dim")
            part.append(_pair(gpu_used, gpu_total), style=_level_style(_fraction(gpu_used, gpu_total)))
            part.append(f" {_percent(gpu.utilization_percent)} {_temperature(gpu)}")
            parts.append(part)
    else:
        gpu_used = _sum(gpu.memory_used_bytes for gpu in gpus)
        gpu_total = _sum(gpu.memory_total_bytes for gpu in gpus)
        known = [gpu.utilization_percent for gpu in gpus if gpu.utilization_percent is not None]
        part = Text(f"{len(gpus)} GPUs ", style="dim")
        part.append(_pair(gpu_used, gpu_total), style=_level_style(_fraction(gpu_used, gpu_total)))
        part.append(f" util {_percent(sum(known) / len(known) if known else None)}")
        parts.append(part)
    processes = host.trainer_processes
    for label, value in (("cpu", _percent(host.cpu_percent)), ("ram", _pair(host.ram_used_bytes, host.ram_total_bytes)),
                         ("rss", format_bytes(host.trainer_rss_bytes, missing=NA))):
        parts.append(Text.assemble((f"{label} ", "dim"), (value, "bold")))
    if processes > 1:
        parts[-1].append(f" ×{processes:.0f}")
    if not gpus:
        parts.append(Text(why_no_gpu(sample.gpu_status), style="dim"))
    return fit_parts(parts, width, Text(" · ", style="dim"))


# ---------------------------------------------------------------------- drawing helpers

def spark(values: Sequence[float | None], low: float | None, high: float | None) -> str:
    """▁..█ from ``low`` to ``high`` (a gap, " ", where a sample had no value; ▄ throughout when flat)."""
    top = len(SPARK_CHARS) - 1
    chars = []
    for value in values:
        if value is None or low is None or high is None:
            chars.append(" ")
        elif high <= low:
            chars.append(SPARK_CHARS[3])
        else:
            chars.append(SPARK_CHARS[max(0, min(top, round((value - low) / (high - low) * top)))])
    return "".join(chars)


def _labelled_bar(label: str, fraction: float | None, width: int, style: str | None = None) -> Text:
    text = Text(label.ljust(LABEL_WIDTH), style="dim")
    text.append_text(_bar(fraction, width, style))
    return text


def _bar(fraction: float | None, width: int, style: str | None = None) -> Text:
    """A bar ``width`` cells wide, filled to ``fraction`` in eighths; in ``style``, or for memory (no
    style given) coloured by how full it is: green, then yellow from 70 %, red from 90 %."""
    if fraction is None:
        return Text("·" * width, style="dim")
    fraction = max(0.0, min(1.0, fraction))
    eighths = round(fraction * width * 8)
    full, partial = divmod(eighths, 8)
    filled = "█" * full + (PARTIAL_BLOCKS[partial] if partial else "")
    return Text.assemble((filled, style or _level_style(fraction)), ("░" * (width - len(filled)), "dim"))


def _level_style(fraction: float | None) -> str:
    if fraction is None:
        return "bold"
    if fraction >= 0.9:
        return "bold red"
    if fraction >= 0.7:
        return "bold yellow"
    return "bold green"


def _pair(used: float | None, total: float | None) -> str:
    """``41.2/79.6 GiB`` in the unit of the total; n/a for what is missing."""
    if used is None and total is None:
        return NA
    unit, scale = byte_unit(total if total is not None else used)
    shown_used = f"{used / scale:.1f}" if used is not None else NA
    shown_total = f"{total / scale:.1f}" if total is not None else NA
    return f"{shown_used}/{shown_total} {unit}"


def _rate(bytes_per_s: float | None) -> str:
    """``41.5 MiB/s``; n/a where the OS does not say."""
    return f"{format_bytes(bytes_per_s)}/s" if bytes_per_s is not None else NA


def _range(low: float, high: float) -> str:
    """``765–895 MiB``, in the unit of the high end."""
    unit, scale = byte_unit(high)
    return f"{three_digits(low / scale)}–{three_digits(high / scale)} {unit}"


def _percent(value: float | None, unit: str = " %") -> str:
    return f"{value:.0f}{unit}" if value is not None else NA


def _temperature(gpu: GpuSample) -> str:
    value = gpu.temperature_c
    return f"{value:.0f}°C" if value is not None else f"{NA} °C"


def _power(gpu: GpuSample, with_limit: bool = True) -> str:
    power, limit = gpu.power_w, gpu.power_limit_w
    if power is None:
        return f"{NA} W"
    if with_limit and limit is not None:
        return f"{power:.0f}/{limit:.0f} W"
    return f"{power:.0f} W"


def _clock(gpu: GpuSample) -> str:
    value = gpu.sm_clock_mhz
    return f"{value:.0f} MHz" if value is not None else f"{NA} MHz"


def _fraction(used: float | None, total: float | None) -> float | None:
    return used / total if used is not None and total else None


def _span_s(samples: Sequence[TelemetrySample]) -> float | None:
    return samples[-1].time - samples[0].time if len(samples) >= 2 else None


def _duration(seconds: float) -> str:
    whole = int(round(seconds))
    return f"{whole // 60}:{whole % 60:02d}" if whole >= 60 else f"{whole} s"


def _sum(values: Iterable[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return sum(present) if present else None

