"""The browser view in a real browser: a run, ``torchlab-tui serve`` on it, and headless Chromium opening the
printed link and saving a screenshot once the page has drawn (Debian's ``chromium``; the ``serve`` extra).

    .venv/bin/python benchmarks/browser_view.py [--out browser_view.png] [--wait 25]

Run by hand, not in CI (Chromium is a large install). xterm.js draws the page's terminal on a canvas, so its
text cannot be read to wait on: the page gets ``--wait`` seconds of real time (``--virtual-time-budget``
took the shot on the splash screen), then the screenshot is saved and looked at: the workbench with the
gradient table, "view only" in the header, the steps going on.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import socket
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from torchlab.core.wire import protocol as p
from torchlab.core.wire.runtime import list_runs
from torchlab.tui.link import ProcessLink

ROOT = Path(__file__).resolve().parent.parent
TINY = f"{ROOT / 'tests' / 'workloads' / 'tiny.py'}:workload"
#: What the page's terminal shows as text: xterm.js's DOM rows, or its screen-reader tree. With a canvas or WebGL
#: renderer neither holds the screen, and the script falls back to waiting ``--wait`` seconds.
PAGE_TEXT = "(document.querySelector('.xterm-rows') || document.querySelector('.xterm-accessibility-tree') || {}).innerText || ''"
GRADIENT_TABLE = "gradient norms"
#: Headless, and quiet: without the last five Chromium calls home at start (updates of its components, sync,
#: field trials, the first-run page), and this script must send nothing beyond the loopback.
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--window-size=1280,800", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--no-default-browser-check")


async def screenshot(browser: str, url: str, out: Path, wait_s: float) -> tuple[float, str]:
    """Open ``url`` in headless Chromium (driven through its DevTools protocol), give the page ``wait_s`` seconds of
    real time, and save a screenshot; returns the seconds and the page's title."""
    import aiohttp

    port = free_port()
    chromium = subprocess.Popen([browser, *CHROMIUM_FLAGS, f"--remote-debugging-port={port}", url],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(200):
                try:
                    async with session.get(f"http://127.0.0.1:{port}/json") as answer:
                        pages = [page for page in await answer.json() if page.get("type") == "page"]
                        if pages:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)
            async with session.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0) as devtools:
                calls = iter(range(1, 1 << 30))

                async def call(method: str, **params):
                    number = next(calls)
                    await devtools.send_json({"id": number, "method": method, "params": params})
                    while True:
                        message = await devtools.receive_json()
                        if message.get("id") == number:
                            return message.get("result", {})

                started = time.monotonic()
                table_seen = False
                while time.monotonic() - started < wait_s:  # the table's title, where the page's text can be read
                    result = await call("Runtime.evaluate", expression=PAGE_TEXT)
                    if GRADIENT_TABLE in (result.get("result", {}).get("value") or ""):
                        table_seen = True
                        await asyncio.sleep(1.0)  # a frame or two more of figures in it
                        break
                    await asyncio.sleep(0.5)
                result = await call("Runtime.evaluate", expression="document.title")
                text = result.get("result", {}).get("value", "")
                text += ", gradient table read on the page" if table_seen else ", page text not readable: waited"
                shot = await call("Page.captureScreenshot", format="png")
                out.write_bytes(base64.b64decode(shot["data"]))
                return time.monotonic() - started, text
    finally:
        chromium.terminate()
        chromium.wait()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("browser_view.png"))
    parser.add_argument("--wait", type=float, default=15.0, help="seconds of the page's life before the screenshot")
    args = parser.parse_args()
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or sys.exit("no chromium: apt-get install -y chromium")
    workdir = Path(tempfile.mkdtemp(prefix="browser-view-"))
    os.environ["XDG_RUNTIME_DIR"] = str(workdir / "xdg")  # this run alone in the listing
    (workdir / "xdg").mkdir(mode=0o700)
    link = ProcessLink(workdir / "run", [TINY, "--steps", "100000", "--checkpoint-every", "0"])
    link.start()
    served = None
    try:
        deadline = time.monotonic() + 120
        while not any(isinstance(message, p.Metrics) for message in link.drain()):
            if time.monotonic() > deadline:
                sys.exit(f"the run did not start: see {workdir / 'run' / 'trainer.log'}")
            link.arrived.wait(1.0)
            link.arrived.clear()
        [entry] = list_runs()
        served = subprocess.Popen([sys.executable, "-m", "torchlab.core.launch.cli", "serve", entry.endpoint.name],
                                  stderr=subprocess.PIPE, text=True)
        link_line = ""
        while "?key=" not in link_line:
            link_line = served.stderr.readline()
            if not link_line:
                sys.exit("serve ended without printing its link")
            print(link_line, end="", file=sys.stderr)
        url = re.search(r"(http://\S+)", link_line).group(1)
        seconds, text = asyncio.run(screenshot(browser, url, args.out, args.wait))
        step = max((m.columns["step"][-1] for m in link.drain() if isinstance(m, p.Metrics)), default="?")
        print(f"screenshot {args.out} after {seconds:.1f} s of the page ({text!r}); the run is at step {step}: look at it")
    finally:
        if served is not None:
            served.terminate()
            served.wait()
        link.close()


if __name__ == "__main__":
    main()
