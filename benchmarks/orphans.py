"""Orphans after ``kill -9`` of the app: how many trainers outlive their app, and how fast they go.

    .venv/bin/python benchmarks/orphans.py            # 20 trials

Each trial starts a stand-in for the app (a process holding a real ``ProcessLink`` to a real trainer
on the tiny test model), waits until training has begun, ``kill -9``s the stand-in, and watches the
trainer: it must write a final checkpoint and exit. An orphan is a trainer still alive 10 s later.
Goal (issue 6): 0 orphans in 20 trials.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "helpers"))

from processes import alive  # noqa: E402

TINY = str(ROOT / "tests" / "workloads" / "tiny.py")
APP_STAND_IN = """
import sys, time
from pathlib import Path
from torchlab.tui.link import ProcessLink
link = ProcessLink(Path(sys.argv[1]), [sys.argv[2], "--steps", "1000000", "--checkpoint-every", "0"])
link.start()
print(link.pid, flush=True)
time.sleep(3600)
"""
ORPHAN_AFTER_S = 10.0


def trial(index: int) -> tuple[bool, float, bool]:
    run_dir = Path(tempfile.mkdtemp()) / f"run{index}"
    app = subprocess.Popen([sys.executable, "-c", APP_STAND_IN, str(run_dir), f"{TINY}:workload"], stdout=subprocess.PIPE, text=True)
    trainer = int(app.stdout.readline())
    metrics = run_dir / "metrics.jsonl"
    while not (metrics.exists() and metrics.stat().st_size > 0):
        time.sleep(0.02)
    app.kill()
    app.wait()
    killed = time.monotonic()
    while alive(trainer) and time.monotonic() - killed < ORPHAN_AFTER_S:
        time.sleep(0.01)
    orphan = alive(trainer)
    if orphan:
        subprocess.run(["kill", "-9", str(trainer)], check=False)
    return orphan, time.monotonic() - killed, (run_dir / "checkpoints" / "last.pt").exists()


def main(trials: int = 20) -> None:
    results = [trial(index) for index in range(trials)]
    orphans = sum(orphan for orphan, _, _ in results)
    exits = [seconds for orphan, seconds, _ in results if not orphan]
    checkpoints = sum(saved for _, _, saved in results)
    print(f"{trials} trials: {orphans} orphan(s); trainer gone after the app's kill -9 in median {statistics.median(exits):.2f} s, "
          f"max {max(exits):.2f} s; final checkpoint written in {checkpoints}/{trials}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
