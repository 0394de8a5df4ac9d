"""What does the engine's own loop cost? ``--headless``'s engine against a plain PyTorch loop.

    .venv/bin/python benchmarks/loop_cost.py                          # interleaved in one process (default)
    .venv/bin/python benchmarks/loop_cost.py --variant no-bar,no-probes   # also an engine without those parts
    .venv/bin/python benchmarks/loop_cost.py --components             # each part's CPU time alone, per step
    .venv/bin/python benchmarks/loop_cost.py --python-work 100        # the engine's Python per step, counted
    .venv/bin/python benchmarks/loop_cost.py --processes --pairs 7 --worker   # whole processes

The workload (``benchmarks/resnet_small.py``: a small residual CNN with BatchNorm, batch 32 of
3x16x16 images) has ~10-20 ms steps on a 2-core CPU, the size where a loop's fixed cost per step
shows. The plain loop (``PlainLoop``) is the same training written by hand: DataLoader (shuffled), the
engine's optimizer and LR schedule, forward, backward, step, ``loss.item()``.

Interleaved (the default, ``interleaved``): the engine and the plain loop in one process, in
alternating blocks of ``--block`` steps, so that the machine's drift hits both alike; the threads of
``--headless`` that run on a clock are costed by their CPU time. See its docstring.

``--processes``: each run a fresh process, the real CLI (``torchlab-tui ... --headless``, stderr on a
pseudo-terminal so the bar is drawn) against ``--plain-loop`` (and ``--worker``: the app's trainer
process with the app's ``ProcessLink`` draining it), one after another in a shuffled order each round,
start-up left out. On a VM whose speed drifts by a third over seconds this cannot resolve a few per
cent; each run gives two figures:

  best     ms/step of its fastest window of 100 consecutive steps: the speed while nothing else slowed
           the machine. A run of a few seconds writes no periodic checkpoint (``--checkpoint-every
           auto``: at most one a minute), only its final one, which no window holds.
  mean     (t[last] - t[from]) / (last - from), drift and all.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import math
import os
import random
import resource
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # benchmarks.resnet_small, when run as a script

from benchmarks.resnet_small import THREADS_FILE_VARIABLE  # noqa: E402  (torch-heavy only when called)
SPEC = f"{ROOT / 'benchmarks' / 'resnet_small.py'}:workload"
BIN = Path(sys.executable).parent


def plain_loop(out: Path, steps: int, seed: int) -> None:
    """``PlainLoop`` for ``steps`` steps in this process; its step timestamps go to ``out``."""
    times: list[float] = []
    PlainLoop(seed, steps).train_steps(steps, on_step=lambda: times.append(time.time()))
    out.write_text(json.dumps({"times": times}))


class PlainLoop:
    """The loop a user writes around the same training the engine runs: DataLoader (shuffled), the
    engine's optimizer (AdamW, weight decay on matrices only: two parameter groups) and LR schedule,
    forward, backward, ``optimizer.step()``, ``scheduler.step()``, ``zero_grad``, ``loss.item()``. The
    same training, so that the difference is the engine's own machinery, not a choice of optimizer."""

    def __init__(self, seed: int, steps: int = 10**9) -> None:
        import torch

        from torchlab.core.engine.adapters.loading import load_workload
        from torchlab.core.engine.schedule import make_scheduler
        from torchlab.core.engine.seeding import seed_everything
        from torchlab.core.engine.optimization import make_optimizer
        from torchlab.core.records.config import build_config

        config = build_config({}, {"workload": SPEC, "steps": steps, "options": {}, "at": []})
        seed_everything(seed)  # as the engine does before the factory: the same initial weights
        workload = load_workload(SPEC)
        self.model, self.loss_fn = workload.model, workload.loss_fn
        self.model.train()
        self.optimizer = make_optimizer(self.model, config)
        self.scheduler = make_scheduler(self.optimizer, config)
        self.loader = torch.utils.data.DataLoader(workload.dataset, batch_size=workload.batch_size, shuffle=True,
                                                  drop_last=True, generator=torch.Generator().manual_seed(seed))
        self.batches = iter(self.loader)

    def train_steps(self, count: int, on_step=None) -> None:
        for _ in range(count):
            try:
                batch = next(self.batches)
            except StopIteration:
                self.batches = iter(self.loader)
                batch = next(self.batches)
            loss = self.loss_fn(self.model, batch)
            loss.backward()
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            loss.item()
            if on_step is not None:
                on_step()


#: What an engine variant of ``interleaved`` can leave out, to see what each part costs.
ENGINE_PARTS = ("bar", "checkpoints", "journals", "probes")


def thread_cpu_ms(call, repeat: int) -> float:
    """Median CPU time of ``call`` on this thread, in ms (5 batches of ``repeat`` calls, after one)."""
    call()
    batches = []
    for _ in range(5):
        started = time.thread_time()
        for _ in range(repeat):
            call()
        batches.append(1000 * (time.thread_time() - started) / repeat)
    return statistics.median(batches)


def bootstrap_interval(pairs: list[tuple[float, float]], draws: int = 2000) -> tuple[float, float]:
    """A 90 % bootstrap interval of sum(a) / sum(b) over the rounds' (a, b) pairs, rounds resampled."""
    ratios = []
    for _ in range(draws):
        sample = random.choices(pairs, k=len(pairs))
        ratios.append(sum(a for a, _ in sample) / sum(b for _, b in sample))
    ratios.sort()
    return ratios[int(0.05 * draws)], ratios[int(0.95 * draws)]


def interleaved(rounds: int, block: int, warmup: int, variants: list[str]) -> None:
    """The engine and a plain loop in one process, in alternating blocks of ``block`` steps (a shuffled
    order each round): the machine's drift, which swamps a few per cent between runs one after
    another, hits both alike at the scale of a block (10 steps: ~0.15 s).

    The engine is what ``--headless`` runs: the run directory's journals, the impact tracker, the bar's
    update per row, probes on ``auto``, periodic checkpoints on ``auto`` (its fsyncs on their thread; the
    minute between two is of wall time, the other runners' blocks included, so the engine writes more of
    them here than it would alone: the figure errs against it). Two threads of ``--headless`` run on a
    clock, not per step, so they cannot be split into blocks: the bar's refresh (2 frames a second) and
    the telemetry sampler (1 a second). Their cost is measured
    here as CPU time per frame and per sample, and added to the engine's time as if every such CPU
    millisecond stopped training for a millisecond (an upper bound: they run beside torch's threads).
    Each of ``variants`` ("no-bar,no-journals", ...) is one more engine, with those parts left out."""
    import torch
    from rich.console import Console

    from torchlab.core.engine.adapters.loading import load_workload
    from torchlab.core.engine.seeding import seed_everything
    from torchlab.core.engine.measure.telemetry import TelemetrySampler
    from torchlab.core.engine.trainer import Trainer
    from torchlab.core.launch.headless import PROGRESS_FRAMES_PER_S, HeadlessProgress
    from torchlab.core.records.config import build_config
    from torchlab.core.analysis.impact import ImpactTracker
    from torchlab.core.records.rundir import RunDirectory

    terminal = Terminal()
    console = Console(file=os.fdopen(terminal.slave, "w", closefd=False), force_terminal=True, width=120)
    total = warmup + rounds * block
    scratch = Path(tempfile.mkdtemp(prefix="loop-cost-"))
    closing = []
    trainers = {}

    def engine(name: str, left_out: set[str]):
        directory = RunDirectory(scratch / name)
        closing.append(directory)
        observers = [] if "bar" in left_out else [HeadlessProgress(total, console)]
        if "journals" not in left_out:
            observers += [directory, ImpactTracker(directory.path / "impact.json")]
        settings = {"workload": SPEC, "steps": total + 1, "options": {}, "at": []}
        if "checkpoints" in left_out:
            settings["checkpoint_every"] = 0
        if "probes" in left_out:
            settings["probe_every"] = 0
        config = build_config({}, settings)
        seed_everything(config.seed)
        trainers[name] = Trainer(config, load_workload(SPEC), observers=observers, checkpoint_dir=directory.checkpoints)
        return trainers[name].train_steps

    runners = {"plain": PlainLoop(0).train_steps, "engine": engine("engine", set())}
    for variant in variants:
        left_out = {part.removeprefix("no-") for part in variant.split(",")}
        unknown = left_out - set(ENGINE_PARTS)
        if unknown:
            raise SystemExit(f"--variant {variant}: no part {', '.join(sorted(unknown))}; the parts: {', '.join(ENGINE_PARTS)}")
        runners[variant] = engine(variant, left_out)
    for train in runners.values():
        train(warmup)
    print(f"workload {SPEC.rsplit('/', 1)[-1]}, torch {torch.__version__} with {torch.get_num_threads()} threads, "
          f"{os.cpu_count()} CPUs; {rounds} rounds of a {block}-step block each, after {warmup} steps of each",
          flush=True)
    seconds: dict[str, list[float]] = {name: [] for name in runners}
    order = list(runners)
    for round_number in range(1, rounds + 1):
        random.shuffle(order)
        for name in order:
            started = time.perf_counter()
            runners[name](block)
            seconds[name].append(time.perf_counter() - started)
        if round_number % max(1, rounds // 10) == 0:
            so_far = {name: 1000 * sum(values) / (block * round_number) for name, values in seconds.items()}
            print(f"after {round_number} rounds: " + ", ".join(f"{name} {ms:.2f}" for name, ms in so_far.items())
                  + " ms/step", flush=True)

    # The threads on a clock, timed on this thread: a frame of the bar as the user's terminal gets it,
    # and a telemetry sample with its journal line.
    trainer = trainers["engine"]
    bar = next(observer for observer in trainer.observers if isinstance(observer, HeadlessProgress))
    with bar:
        bar._live.auto_refresh = False  # no refresh thread: its frames are drawn here, timed
        frame_ms = thread_cpu_ms(bar._live.refresh, 20)
    sampler = TelemetrySampler(trainer.device, trainer.reporter.telemetry, lambda: trainer.step)
    sample_ms = thread_cpu_ms(lambda: trainer.reporter.telemetry(sampler.sample()), 10)
    clock_ms_per_s = frame_ms * PROGRESS_FRAMES_PER_S + sample_ms * 1.0
    for directory in closing:
        directory.close()
    terminal.close()
    shutil.rmtree(scratch)

    print(f"\nthreads on a clock, CPU per second of training: the bar {PROGRESS_FRAMES_PER_S} x {frame_ms:.2f} ms, "
          f"telemetry 1 x {sample_ms:.2f} ms: {clock_ms_per_s:.2f} ms, {clock_ms_per_s / 10:.2f} % (added to every engine)")
    print(f"\n{'runner':<36} {'ms/step':>8} {'+ clock':>8} {'vs plain':>9} {'90 % interval':>14} {'median of rounds':>17}")
    plain_total = sum(seconds["plain"])
    for name, values in seconds.items():
        clock = 0.0 if name == "plain" else clock_ms_per_s / 1000
        pairs = [(p, v * (1 + clock)) for p, v in zip(seconds["plain"], values)]
        low, high = bootstrap_interval(pairs)
        ms = 1000 * sum(values) / (block * rounds)
        print(f"{name:<36} {ms:>8.2f} {ms * (1 + clock):>8.2f} {plain_total / sum(v for _, v in pairs):>9.3f} "
              f"{f'{low:.3f}–{high:.3f}':>14} {statistics.median(p / v for p, v in pairs):>17.3f}")


class Terminal:
    """A pseudo-terminal 120x40 for a child's stdout and stderr, drained by a thread (what a user's
    terminal does), so Rich draws its progress bar as it would for a person."""

    def __init__(self) -> None:
        self.master, self.slave = os.openpty()
        fcntl.ioctl(self.slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        self.received = 0
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: the last writer closed
                return
            if not chunk:
                return
            self.received += len(chunk)

    def close(self) -> None:
        os.close(self.slave)
        self._thread.join(timeout=5)
        os.close(self.master)


def busy_cpu_s() -> float:
    """CPU seconds the whole machine has been busy (all cores, every process), from /proc/stat."""
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    """CPU seconds of this process and of its children that have been waited for."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


class ForeignLoad:
    """How many cores other processes kept busy while a run ran: a run that shared the machine is
    measured again (``--max-foreign``), since with torch's threads on every core a neighbour's
    single busy thread can double a step's time."""

    def __enter__(self) -> ForeignLoad:
        self._busy, self._own, self._wall = busy_cpu_s(), own_cpu_s(), time.perf_counter()
        return self

    def __exit__(self, *exc_info) -> None:
        wall = time.perf_counter() - self._wall
        self.cores = max(0.0, (busy_cpu_s() - self._busy) - (own_cpu_s() - self._own)) / wall


def wait_for_quiet(max_foreign: float, patience_s: float) -> None:
    """Wait (up to ``patience_s``) until other processes use less than ``max_foreign`` cores over 3 s."""
    deadline = time.monotonic() + patience_s
    while time.monotonic() < deadline:
        with ForeignLoad() as load:
            time.sleep(3)
        if load.cores < max_foreign:
            return
        print(f"  (waiting: other processes keep {load.cores:.2f} cores busy)", flush=True)


class Process:
    """A runner's child process, started; ``times()`` once it has ended: {step: time.time() when it ended}."""

    def __init__(self, popen: subprocess.Popen, times, terminal: Terminal | None, close=None) -> None:
        self.popen, self._times, self._terminal, self._close = popen, times, terminal, close
        self.started = time.perf_counter()
        self.wall: float | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def finished(self) -> bool:
        if self.popen.poll() is None:
            return False
        if self.wall is None:
            self.wall = time.perf_counter() - self.started
        return True

    def wait(self) -> None:
        self.popen.wait()
        self.finished()

    def times(self) -> dict[int, float]:
        code = self._close() if self._close else self.popen.returncode
        if self._terminal:
            self._terminal.close()
        if code != 0:
            raise SystemExit(f"{self.popen.args[:3]} exited with code {code}")
        return self._times()


def spawn(args: list[str], tty: bool, env: dict[str, str]) -> tuple[subprocess.Popen, Terminal | None]:
    """A child with stdout and stderr on a terminal (or discarded), in this checkout."""
    terminal = Terminal() if tty else None
    sink = terminal.slave if terminal else subprocess.DEVNULL
    popen = subprocess.Popen(args, stdout=sink, stderr=sink, stdin=subprocess.DEVNULL, env={**os.environ, **env}, cwd=ROOT)
    return popen, terminal


def metrics_times(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row["time"] for row in rows}


def threads_file(work: Path, name: str) -> dict[str, str]:
    """The environment that makes the workload's factory write its torch thread count to ``work/threads-NAME``."""
    return {THREADS_FILE_VARIABLE: str(work / f"threads-{name}")}


def start_engine(work: Path, name: str, steps: int, tty: bool, bin_dir: Path = BIN, flags: tuple[str, ...] = ()) -> Process:
    """``torchlab-tui SPEC --headless`` with every default (and ``flags``), from ``bin_dir``'s environment."""
    run_dir = work / f"{name}-{time.monotonic_ns()}"
    popen, terminal = spawn([str(bin_dir / "torchlab-tui"), SPEC, "--headless", "--steps", str(steps),
                             "--run-dir", str(run_dir), *flags], tty, threads_file(work, name))
    return Process(popen, lambda: metrics_times(run_dir), terminal)


def start_plain(work: Path, name: str, steps: int, tty: bool) -> Process:
    out = work / f"{name}-{time.monotonic_ns()}.json"
    popen, terminal = spawn([sys.executable, __file__, "--plain-loop", str(out), "--steps", str(steps)], tty,
                            threads_file(work, name))
    return Process(popen, lambda: dict(enumerate(json.loads(out.read_text())["times"], start=1)), terminal)


def start_worker(work: Path, name: str, steps: int, tty: bool) -> Process:
    """The app's trainer process (``python -m torchlab.core.launch.worker``, this checkout's) with a client, the app's
    own ``ProcessLink``, whose reader thread takes every message off the socket as the app's does."""
    from torchlab.tui.link import ProcessLink

    run_dir = work / f"{name}-{time.monotonic_ns()}"
    link = ProcessLink(run_dir, [SPEC, "--steps", str(steps)])
    os.environ.update(threads_file(work, name))  # the link's child inherits this process's environment
    try:
        link.start()
    finally:
        os.environ.pop(THREADS_FILE_VARIABLE)
    drained = threading.Event()

    def drain() -> None:  # the app folds what arrives on a timer; here it is only taken and dropped
        while not drained.is_set():
            link.drain()
            time.sleep(0.05)

    threading.Thread(target=drain, daemon=True).start()

    def close() -> int | None:
        drained.set()
        return link.close(grace_s=30)

    return Process(link.process, lambda: metrics_times(run_dir), None, close)


def runner_table(args: argparse.Namespace) -> dict[str, object]:
    """name -> start(work, name, steps, tty): the runners this invocation compares."""
    runners: dict[str, object] = {"plain": start_plain}
    if not args.engine_from:
        runners["engine"] = start_engine
    for other in args.engine_from:
        name, _, bin_dir = other.partition("=")
        runners[name] = lambda work, n, steps, tty, bin_dir=Path(bin_dir): start_engine(work, n, steps, tty, bin_dir)
    for also in args.also:
        name, _, flags = also.partition("=")
        runners[name] = lambda work, n, steps, tty, flags=tuple(flags.split()): start_engine(work, n, steps, tty, flags=flags)
    if args.worker:
        runners["worker"] = start_worker
    return runners


def python_work(steps: int) -> None:
    """The engine's own Python per step against the plain loop's, counted rather than timed: bytecodes executed
    (``sys.settrace`` with ``f_trace_opcodes``) and calls into C (``sys.setprofile``), over ``steps`` steps of each
    after 300 of warm-up. A count does not move with the machine's load, where a time on this shared VM moves by a
    third. The engine is ``interleaved``'s (bar, journals, impact tracker) with the parts that run on a clock left
    out: memory by kind once a second, checkpoints once a minute and the probe's self-timed cadence would run on
    every step under the tracer, which makes a step ~50x slower. What is counted is the work every step does."""
    from collections import Counter

    from rich.console import Console

    from torchlab.core.analysis.impact import ImpactTracker
    from torchlab.core.engine.adapters.loading import load_workload
    from torchlab.core.engine.seeding import seed_everything
    from torchlab.core.engine.trainer import Trainer
    from torchlab.core.launch.headless import HeadlessProgress
    from torchlab.core.records.config import build_config
    from torchlab.core.records.rundir import RunDirectory

    terminal = Terminal()
    console = Console(file=os.fdopen(terminal.slave, "w", closefd=False), force_terminal=True, width=120)
    scratch = Path(tempfile.mkdtemp(prefix="loop-cost-work-"))
    directory = RunDirectory(scratch / "engine")
    settings = {"workload": SPEC, "steps": 10**9, "options": {}, "at": [], "probe_every": 0, "memory_every": 0,
                "checkpoint_every": 0}
    config = build_config({}, settings)
    seed_everything(config.seed)
    observers = [HeadlessProgress(10**9, console), directory, ImpactTracker(directory.path / "impact.json")]
    runners = {"engine": Trainer(config, load_workload(SPEC), observers=observers,
                                 checkpoint_dir=directory.checkpoints).train_steps,
               "plain": PlainLoop(0).train_steps}
    counts: Counter[str] = Counter()

    def on_opcode(frame, event, arg):
        if event == "call":
            frame.f_trace_opcodes = True
        elif event == "opcode":
            counts["opcodes"] += 1
        return on_opcode

    def on_call(frame, event, arg) -> None:
        if event == "c_call":
            counts["c_calls"] += 1

    per_step = {}
    for name, train in runners.items():
        train(300)
        counts.clear()
        sys.settrace(on_opcode)
        sys.setprofile(on_call)
        try:
            train(steps)
        finally:
            sys.settrace(None)
            sys.setprofile(None)
        per_step[name] = {key: value / steps for key, value in counts.items()}
    directory.close()
    terminal.close()
    shutil.rmtree(scratch)
    engine, plain = per_step["engine"], per_step["plain"]
    print(f"per step, over {steps} steps of each: engine {engine['opcodes']:.0f} bytecodes, {engine['c_calls']:.0f} calls "
          f"into C; plain loop {plain['opcodes']:.0f} and {plain['c_calls']:.0f}; the engine's own: "
          f"{engine['opcodes'] - plain['opcodes']:.0f} bytecodes, {engine['c_calls'] - plain['c_calls']:.0f} calls into C")


def components(step_ms: float | None) -> None:
    """Where the engine's own time goes, per step: each part timed alone (CPU time of the thread that runs
    it, medians), on the records and state of a real run of the workload, scaled to one step of
    ``step_ms`` (default: this run's)."""
    import gc
    import pty

    import torch
    from rich.console import Console

    from torchlab.core.wire import protocol
    from torchlab.core.records.config import build_config
    from torchlab.core.engine.state.checkpoint import AUTO_CHECKPOINT_BUDGET, AUTO_CHECKPOINT_MIN_INTERVAL_S, AUTO_CHECKPOINT_STEPS
    from torchlab.core.engine.seeding import seed_everything
    from torchlab.core.launch.headless import HeadlessProgress
    from torchlab.core.wire.events import RunStarted
    from torchlab.core.analysis.impact import ImpactTracker
    from torchlab.core.engine.adapters.loading import load_workload
    from torchlab.core.wire.metrics_row import MetricsRow
    from torchlab.core.wire.observer import TrainerObserver
    from torchlab.core.wire.outbox import Outbox
    from torchlab.core.records.rundir import RunDirectory, to_json_line
    from torchlab.core.engine.measure.telemetry import TelemetrySampler
    from torchlab.core.engine.trainer import Trainer
    from torchlab.core.launch.outbox_reporter import OutboxReporter

    def cost_us(call, repeat: int) -> float:
        return 1000 * thread_cpu_ms(call, repeat)

    class Rows(TrainerObserver):
        def __init__(self) -> None:
            self.rows: list[MetricsRow] = []

        def on_metrics(self, row: MetricsRow) -> None:
            self.rows.append(row)

    scratch = Path(tempfile.mkdtemp(prefix="loop-cost-parts-"))
    seed_everything(0)
    config = build_config({}, {"workload": SPEC, "steps": 10**9, "checkpoint_every": 0, "options": {}, "at": []})
    rows = Rows()
    trainer = Trainer(config, load_workload(SPEC), observers=[rows], checkpoint_dir=scratch / "checkpoints")
    (scratch / "checkpoints").mkdir()
    collections = {"cpu": 0.0}
    gc_started = {}

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            gc_started["t"] = time.thread_time()
        else:
            collections["cpu"] += time.thread_time() - gc_started["t"]

    trainer.train_steps(50)
    gc.callbacks.append(on_gc)
    started = time.perf_counter()
    trainer.train_steps(300)
    step_s = (time.perf_counter() - started) / 300
    gc.callbacks.remove(on_gc)
    records = rows.rows[-300:]
    cycle = iter(records * 100)
    step_s = step_ms / 1000 if step_ms else step_s
    per_s = 1 / step_s
    cadence = trainer.instruments.cadence
    interval = cadence.interval
    print(f"per step of {1000 * step_s:.2f} ms; probe every "
          f"{interval} step(s) at {1000 * cadence.probe_cost_s:.2f} ms (its own timing)\n")
    table: list[tuple[str, float, str]] = []

    def row(name: str, per_step_us: float, how: str) -> None:
        table.append((name, per_step_us, how))

    row("gradient-norm probe (auto cadence)", 1e6 * cadence.probe_cost_s / interval,
        f"{1e3 * cadence.probe_cost_s:.2f} ms every {interval} steps (self-timed, in the loop)")
    loss = torch.tensor(2.5)
    per_module = torch.rand(len(trainer.instruments.grad_probe.module_names))
    packing = cost_us(lambda: torch.cat([loss.view(1), loss.view(1), per_module]).tolist(), 2000)
    item = cost_us(loss.item, 2000)
    row("a probe step's host transfer: torch.cat(...).tolist() vs loss.item()", (packing - item) / interval,
        f"{packing:.1f} vs {item:.1f} us, every {interval} steps")
    row("scheduler.step() + scale_lr()", cost_us(trainer.scheduler.step, 500) + cost_us(lambda: trainer.parts.optimization.scale_lr(1.0), 2000), "")
    options = trainer.options
    row("MetricsRow.json_object() (each row written or sent)", cost_us(lambda: next(cycle).json_object(), len(records)), "")
    row("the step boundary with nothing queued", cost_us(trainer.boundary.apply, 2000), "")

    directory = RunDirectory(scratch / "run")
    row("RunDirectory.on_metrics (encode + append)", cost_us(lambda: directory.on_metrics(next(cycle)), len(records)), "")
    row("  of which the encoding", cost_us(lambda: to_json_line(next(cycle).json_object()), len(records)), "json_object + strict_json")
    impact = ImpactTracker(scratch / "impact.json")
    impact.on_event(RunStarted(step=0, device="cpu", batch_size=32, steps=10**9, options=options.as_dict(), modules=[],
                               module_params=[], checkpoint_blocks=[], world_size=1, ranks=None))
    row("ImpactTracker.on_metrics", cost_us(lambda: impact.on_metrics(next(cycle)), len(records)), "")
    reporter = OutboxReporter(Outbox())
    row("OutboxReporter.on_metrics (the app's trainer only)", cost_us(lambda: reporter.on_metrics(next(cycle)), len(records)), "")
    row("  its sender thread: rows encoded for the socket", cost_us(lambda: protocol.Metrics.from_rows(records[:20]).encode(), 50) / 20,
        "per row, in batches of 20")

    master, slave = pty.openpty()  # Rich draws as for a person only on a terminal

    def drain() -> None:
        while True:
            try:
                if not os.read(master, 65536):
                    return
            except OSError:
                return

    threading.Thread(target=drain, daemon=True).start()
    console = Console(file=os.fdopen(slave, "w"), force_terminal=True, width=120)
    progress = HeadlessProgress(10**9, console)
    frames_per_s = progress._live.refresh_per_second
    progress._live.auto_refresh = False  # frames drawn here, timed, not by its thread
    with progress:
        update = cost_us(lambda: progress.on_metrics(next(cycle)), len(records))
        frame = cost_us(progress._live.refresh, 20)
    row("HeadlessProgress.on_metrics (the bar's update)", update, "")
    row(f"progress bar frames ({frames_per_s:g}/s, Rich's thread)", frame * frames_per_s / per_s, f"{frame / 1000:.2f} ms a frame")
    sampler = TelemetrySampler(trainer.device, lambda sample: None, lambda: 0)
    sample = cost_us(sampler.sample, 20)
    sampler.stop()
    row("telemetry sample (1/s, its thread)", sample / per_s, f"{sample / 1000:.2f} ms a sample")
    record = sampler.sample()
    row("  + RunDirectory.on_telemetry", cost_us(lambda: directory.on_telemetry(record), 50) / per_s, "")

    trainer.parts.config = build_config({}, {"workload": SPEC, "steps": 10**9, "checkpoint_every": 100, "options": {}, "at": []})
    waits: list[float] = []
    checkpoints = trainer.checkpoints
    finish = checkpoints.finish  # where the next step waits for the checkpoint's thread

    def timed_finish() -> None:
        began = time.perf_counter()
        finish()
        waits.append(time.perf_counter() - began)

    checkpoints.finish = timed_finish
    on_thread = []
    for _ in range(7):
        trainer.parts.progress.step += 1
        began = time.perf_counter()
        checkpoints.save("periodic")
        written = time.perf_counter() - began
        waits.clear()
        trainer.train_steps(1)
        on_thread.append(written + sum(waits))
    checkpoint_ms = 1000 * statistics.median(on_thread)
    # --checkpoint-every auto: the first 100th step once max(a minute, 100 x a checkpoint's cost) has passed
    wait_s = max(AUTO_CHECKPOINT_MIN_INTERVAL_S, checkpoint_ms / 1000 / AUTO_CHECKPOINT_BUDGET)
    every = AUTO_CHECKPOINT_STEPS * math.ceil(wait_s / step_s / AUTO_CHECKPOINT_STEPS)
    row("periodic checkpoint (auto cadence)", 1000 * checkpoint_ms / every,
        f"{checkpoint_ms:.1f} ms of the training thread's time (wall) every {every} steps; "
        f"{1000 * checkpoint_ms / AUTO_CHECKPOINT_STEPS:.1f} us/step if every 100")
    row("garbage collection", 1e6 * collections["cpu"] / 300, "the run's collections, per step")
    directory.close()

    print(f"{'part':<58} {'us/step':>8}  how")
    for name, value, how in table:
        print(f"{name:<58} {value:>8.1f}  {how}")
    total = sum(value for name, value, how in table if not name.startswith("  ") and "OutboxReporter" not in name)
    print(f"{'sum (headless; the indented lines are inside the line above)':<58} {total:>8.1f}  "
          f"= {100 * total / (1e6 * step_s):.1f} % of a {1000 * step_s:.2f} ms step")


#: The steps of a window of ``steady_figures``' fastest.
WINDOW_STEPS = 100


def steady_figures(times: dict[int, float], from_step: int) -> dict[str, float]:
    """A run's ms/step from ``from_step`` on: its fastest window of WINDOW_STEPS steps, and its mean."""
    last = max(times)
    windows = [(times[start + WINDOW_STEPS] - times[start]) / WINDOW_STEPS for start in range(from_step, last - WINDOW_STEPS + 1)]
    return {"best": 1000 * min(windows), "mean": 1000 * (times[last] - times[from_step]) / (last - from_step)}


def report(results: dict[str, list[dict[str, float]]], walls: dict[str, list[float]]) -> None:
    """Per runner and figure: the median ms/step, and its throughput against the plain loop's (the median
    of the rounds' ratios, each round's runs being neighbours in time, with their range)."""
    plain = results["plain"]
    print(f"\n{'runner':<8} {'figure':<6} {'ms/step (median)':>17} {'vs plain (median of rounds)':>28} "
          f"{'range of rounds':>16}  process wall")
    for name, runs in results.items():
        for figure in ("best", "mean"):
            ratios = [p[figure] / r[figure] for p, r in zip(plain, runs)]
            print(f"{name:<8} {figure:<6} {statistics.median(r[figure] for r in runs):>17.2f} "
                  f"{statistics.median(ratios):>28.3f} {f'{min(ratios):.3f}–{max(ratios):.3f}':>16}  "
                  f"{statistics.median(walls[name]):.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", action="store_true",
                        help="whole processes one after another (the real CLI, its start-up left out) instead of "
                             "blocks interleaved in one process")
    parser.add_argument("--rounds", type=int, default=150, help="interleaved: rounds of one block each (default 150)")
    parser.add_argument("--variant", action="append", default=[], metavar="no-PART,...",
                        help=f"interleaved: also an engine without these parts ({', '.join(ENGINE_PARTS)}); repeatable")
    parser.add_argument("--block", type=int, default=10, help="interleaved: steps in a block (default 10)")
    parser.add_argument("--pairs", type=int, default=5, help="--processes: rounds of one run of each runner (default 5)")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--from-step", type=int, default=50, help="the steady state starts here (default 50)")
    parser.add_argument("--worker", action="store_true", help="also run the app's trainer process")
    parser.add_argument("--max-foreign", type=float, default=0.1, metavar="CORES",
                        help="measure a run again if other processes kept more cores than this busy meanwhile "
                             "(default 0.1)")
    parser.add_argument("--retries", type=int, default=3, help="how many times (default 3)")
    parser.add_argument("--patience", type=float, default=600, metavar="S",
                        help="before each run, wait up to this long for other processes to go quiet (default 600)")
    parser.add_argument("--also", action="append", default=[], metavar="NAME=FLAGS",
                        help="another engine runner with extra flags, e.g. no-ckpt='--checkpoint-every 0' (repeatable)")
    parser.add_argument("--engine-from", action="append", default=[], metavar="NAME=BIN_DIR",
                        help="an engine runner from another environment (another commit), in place of this "
                             "checkout's: e.g. before=../base/.venv/bin (repeatable)")
    parser.add_argument("--no-tty", action="store_true", help="children's output discarded, not on a terminal")
    parser.add_argument("--components", action="store_true",
                        help="instead: time each part of the engine's per-step work alone, in this process")
    parser.add_argument("--python-work", type=int, metavar="STEPS",
                        help="instead: count the Python the engine runs per step beyond the plain loop's, over STEPS steps")
    parser.add_argument("--step-ms", type=float, help="with --components: the step time to scale to (default: measured)")
    parser.add_argument("--plain-loop", type=Path, metavar="OUT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.plain_loop:
        plain_loop(args.plain_loop, args.steps, seed=0)
        return
    if args.components:
        components(args.step_ms)
        return
    if args.python_work:
        python_work(args.python_work)
        return
    if not args.processes:
        interleaved(args.rounds, args.block, warmup=args.from_step, variants=args.variant)
        return

    import torch

    runners = runner_table(args)
    tty = not args.no_tty
    print(f"workload {SPEC.rsplit('/', 1)[-1]}, {args.steps} steps, steady state from step {args.from_step}; "
          f"torch {torch.__version__}, {os.cpu_count()} CPUs, {args.pairs} rounds, "
          f"one run after another, output on a "
          f"{'pseudo-terminal' if tty else 'null device'}", flush=True)
    results: dict[str, list[dict[str, float]]] = {name: [] for name in runners}
    walls: dict[str, list[float]] = {name: [] for name in runners}
    with tempfile.TemporaryDirectory(prefix="loop-cost-") as scratch:
        work = Path(scratch)
        order = list(runners)
        for round_number in range(1, args.pairs + 1):
            random.shuffle(order)
            line = []
            for name in order:
                for attempt in range(args.retries + 1):
                    wait_for_quiet(args.max_foreign, patience_s=args.patience)
                    with ForeignLoad() as load:
                        process = runners[name](work, name, args.steps, tty)
                        process.wait()
                        times = process.times()
                    if load.cores < args.max_foreign:
                        break
                    print(f"  ({name} shared the machine with {load.cores:.2f} busy cores: "
                          f"{'measured again' if attempt < args.retries else 'kept'})", flush=True)
                results[name].append(steady_figures(times, args.from_step))
                walls[name].append(process.wall)
                figures = results[name][-1]
                line.append(f"{name} {figures['best']:.2f} best, {figures['mean']:.2f} mean ms/step ({process.wall:.1f} s)")
            print(f"round {round_number}: " + ", ".join(line), flush=True)
        threads = {name: (work / f"threads-{name}").read_text() for name in runners}
    print(f"torch threads: {', '.join(f'{name} {count}' for name, count in threads.items())}")
    report(results, walls)


if __name__ == "__main__":
    main()
