"""What one redraw costs at 120x40 with a long history: the charts, and a full frame.

    .venv/bin/python benchmarks/redraw_cost.py            # 10k steps of history
    .venv/bin/python benchmarks/redraw_cost.py 100000

Feeds the app deterministic data (the tests' FakeLink), appends one step at a time, and times the
charts' drawing and a full compositor render, ten times each; prints the medians. A 10 Hz UI has
100 ms per frame in all; the goal is to spend a small part of it.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent / "tests" / "helpers")]

from fake_link import FakeLink, quiet_app, record, training_events  # noqa: E402

from torchlab.core.wire import protocol  # noqa: E402
from torchlab.tui.widgets.line_chart import LineChart  # noqa: E402


async def measure(history: int) -> tuple[float, float]:
    link = FakeLink(training_events(history))
    app = quiet_app(link)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        charts = list(app.query(LineChart))
        chart_times, frame_times = [], []
        for step in range(history + 1, history + 11):
            link.push(protocol.Metrics.from_rows([record(step)]))
            app.poll_now()
            started = time.perf_counter()
            for chart in charts:
                chart._draw(chart.size.width, chart.size.height)
            chart_times.append(time.perf_counter() - started)
            started = time.perf_counter()
            app.screen._compositor.render_update(full=True)
            frame_times.append(time.perf_counter() - started)
            await pilot.pause()
    return statistics.median(chart_times), statistics.median(frame_times)


if __name__ == "__main__":
    history = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    charts, frame = asyncio.run(measure(history))
    print(f"{history:,} steps of history at 120x40: charts {1000 * charts:.1f} ms, full frame {1000 * frame:.1f} ms (medians of 10)")
