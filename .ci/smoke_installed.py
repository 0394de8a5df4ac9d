"""CI: the wheel as users install it. Run by ``.ci/run`` with the interpreter of a fresh virtual
environment that has the wheel installed non-editably, from a directory outside the checkout.

It checks that the installed package is what gets imported (not the checkout), that ``--version``
answers, that a headless run of a sample trains and writes its run directory, that ``plan`` predicts, and
that the real app, driven headlessly by Textual's Pilot against a real trainer process, draws the gradient
table and what fits (whose forecaster is a process the wheel's module runs): a module, stylesheet or data file
missing from the wheel fails one of these.

    python smoke_installed.py
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

STEPS_HEADLESS = 3
APP_TIMEOUT_S = 120.0


def fail(message: str) -> None:
    print(f"smoke test: FAILED: {message}", file=sys.stderr)
    sys.exit(1)


def check_installed_package_is_imported() -> None:
    import torchlab.tui.app

    location = Path(torchlab.tui.app.__file__).resolve()
    site_packages = Path(sysconfig.get_paths()["purelib"]).resolve()
    if site_packages not in location.parents:
        fail(f"torchlab.tui.app was imported from {location}, not from the installed wheel in {site_packages}")
    print(f"smoke test: torchlab imported from {location.parent.parent}")


def run_command(*args: str) -> subprocess.CompletedProcess:
    command = [str(Path(sys.executable).with_name("torchlab-tui")), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


def check_version() -> None:
    result = run_command("--version")
    if result.returncode != 0 or not result.stdout.startswith("torchlab-tui "):
        fail(f"--version: exit {result.returncode}, printed {result.stdout!r} {result.stderr!r}")
    print(f"smoke test: {result.stdout.strip()}")


def check_headless_run(work: Path) -> None:
    run_dir = work / "headless"
    result = run_command("mlp", "--headless", "--steps", str(STEPS_HEADLESS), "--run-dir", str(run_dir))
    if result.returncode != 0:
        fail(f"headless run of mlp exited {result.returncode}:\n{result.stderr}")
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    if steps[-1:] != [STEPS_HEADLESS] or not (run_dir / "checkpoints" / "last.pt").exists():
        fail(f"headless run of mlp: metrics steps {steps}, checkpoint present: {(run_dir / 'checkpoints' / 'last.pt').exists()}")
    print(f"smoke test: headless mlp trained {STEPS_HEADLESS} steps into {run_dir}")


def check_plan() -> None:
    """``torchlab-tui plan``: the forecast's modules and torch's memory trackers, as the wheel installs them."""
    result = run_command("plan", "mlp", "--gpus", "2", "--json")
    if result.returncode != 0:
        fail(f"plan mlp exited {result.returncode}:\n{result.stderr}")
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    if rows[0]["change"] != "as configured" or not rows[0]["prediction"]["peak_bytes"] > 0:
        fail(f"plan mlp printed {result.stdout!r}")
    print(f"smoke test: plan mlp predicted {len(rows)} settings, as configured a peak of "
          f"{rows[0]['prediction']['peak_bytes']} bytes")


async def check_app_draws_the_gradient_table(work: Path) -> None:
    from torchlab.tui.app import TorchlabApp
    from torchlab.tui.link import ProcessLink
    from torchlab.tui.widgets.grad_table import GradTable

    links: list[ProcessLink] = []

    def link() -> ProcessLink:
        # --forecast-priority low: what fits answers while the mlp keeps both cores busy (its idle class is the suite's)
        links.append(ProcessLink(work / "app", ["mlp", "--steps", "100000", "--checkpoint-every", "0",
                                                "--forecast-priority", "low"]))
        return links[-1]

    app = TorchlabApp(link, workload="mlp")
    async with app.run_test(size=(80, 24)) as pilot:
        deadline = time.monotonic() + APP_TIMEOUT_S
        while not (app.query_one(GradTable).displayed_keys and app.run_state.step >= 2):
            if time.monotonic() > deadline or app.run_state.failure is not None:
                failure = app.run_state.failure
                fail(f"the app drew no gradient rows (state {app.run_state.state!r}, failure {failure and failure.message!r})")
            await pilot.pause(0.1)
        rows = app.query_one(GradTable).displayed_keys
        print(f"smoke test: the app drew the gradient table at step {app.run_state.step}: {', '.join(rows[:4])}, …")
        await pilot.press("F")  # what fits: the forecaster process, as the wheel installs it (python -m ...)
        deadline = time.monotonic() + APP_TIMEOUT_S
        while app.run_state.predicted() is None:
            if time.monotonic() > deadline:
                fail(f"what fits predicted nothing in {APP_TIMEOUT_S} s: {app.run_state.predictions}")
            await pilot.pause(0.1)
        in_force = app.run_state.predicted()
        if in_force.prediction is None:
            fail(f"what fits could not predict the settings in force: {in_force.error}")
        print(f"smoke test: what fits predicted the settings in force: a peak of {in_force.prediction.peak_bytes} bytes "
              f"(fits: {in_force.verdict})")
        await pilot.press("escape", "q")
        deadline = time.monotonic() + APP_TIMEOUT_S
        while app.is_running and time.monotonic() < deadline:
            await pilot.pause(0.1)
    if app.return_code != 0:
        fail(f"the app exited with {app.return_code} after q")


def main() -> None:
    check_installed_package_is_imported()
    check_version()
    with tempfile.TemporaryDirectory(prefix="torchlab-smoke-") as directory:
        work = Path(directory)
        check_headless_run(work)
        check_plan()
        asyncio.run(check_app_draws_the_gradient_table(work))
    print("smoke test: passed")


if __name__ == "__main__":
    main()
