"""The trainer's news in words (a trial begun, a compile, a skipped step, a resume) reaches the app as the typed
event, and the app's event log and a headless run say it in the same words, made once (``events.describe``).

The worker turned each into a Log line of its own wording, and headless.py wrote its own again: a resume read
"resumed from the checkpoint of step 9" in the app and "resumed from checkpoint" in headless."""

from __future__ import annotations

import io

from fake_link import past_ended, welcome
from rich.console import Console

from torchlab.core.launch.headless import HeadlessProgress
from torchlab.core.launch.outbox_reporter import OutboxReporter
from torchlab.core.wire import events
from torchlab.core.wire import protocol as p
from torchlab.core.wire.outbox import Cursor, Outbox
from torchlab.tui.state import RunState

#: Each event, and its sentence (the app's log line; headless writes "step N: " before it).
SAID = [
    (events.TrialStarted(step=4, option="amp", value="bf16", steps=12, source="app"),
     "trying amp = bf16 for 12 steps against as many as it is"),
    (events.CompileStarted(step=6, detail="with amp=bf16"),
     "compiling the model with amp=bf16 (torch.compile): training waits for it"),
    (events.StepSkipped(step=7, reason="fp16 gradients overflowed; the loss scale is now 32768", scale=32768.0),
     "warning: step skipped: fp16 gradients overflowed; the loss scale is now 32768"),
    (events.OomRescued(step=7, option="split", value=2, previous=1, error="CUDA out of memory. Tried to allocate 2.00 GiB",
                       samples_before=15, samples_after=8),
     "warning: step 7 ran out of memory (CUDA out of memory. Tried to allocate 2.00 GiB): retried with split = 2 (was 1), "
     "in force from now on; 8 samples a forward, not 15"),
    (events.OomRescued(step=7, option="checkpointing", value=True, previous=False, error="CUDA out of memory.",
                       note="this run's batches cannot be split (no first dimension their tensors share)"),
     "warning: step 7 ran out of memory (CUDA out of memory.): retried with checkpointing = on (was off), in force "
     "from now on; this run's batches cannot be split (no first dimension their tensors share)"),
    (events.SpikeGuarded(step=21, measure="loss", value=18479.0, median=0.7653, z=81.57, threshold=6.0, window=50,
                         action="rolled_back", rolled_back_to=10),
     "warning: spike at step 21: loss 1.848e+04, 2.41e+04 times the median 0.7653 of the last 50 steps, 81.6 robust "
     "deviations (threshold 6): rolled back to the weights and optimizer of step 10: steps 11-21 undone, their batches "
     "not trained on again"),
    (events.SpikeGuarded(step=21, measure="grad_norm", value=None, median=0.5, z=None, threshold=6.0, window=50,
                         action="skipped"),
     "warning: spike at step 21: grad norm not finite: its update held back, training goes on with the next batch"),
    (events.SpikeGuarded(step=1703, measure="loss", value=9.1, median=2.3, z=12.0, threshold=6.0, window=50,
                         action="let_through", held_back=36),
     "warning: spike at step 1703: loss 9.1, 3.96 times the median 2.3 of the last 50 steps, 12 robust deviations "
     "(threshold 6): applied: the spike guard is off (key G or --spike-guard skip holds such a step's update back); 36 "
     "more since the last notice, each marked in its metrics row"),
    (events.ProfileStarted(step=8, steps=5), "profiling 5 steps after 1 warm-up"),
    (events.ResumedFromCheckpoint(step=9), "resumed from the checkpoint of step 9"),
    (events.ResumeChangedSettings(step=9, level="warning", message="resumed with seed 7 → 3: from here on the run differs"),
     "warning: resumed with seed 7 → 3: from here on the run differs"),
    (events.ResumeChangedSettings(step=9, level="info", message="resumed with steps 20 → 40"), "resumed with steps 20 → 40"),
    (p.Log(level="info", step=0, text="the workload's own starting values: steps 300, batch_size 16, accum 2"),
     "the workload's own starting values: steps 300, batch_size 16, accum 2"),
    (events.StopRequested(step=10, reason="stopped by `torchlab-tui stop`"),
     "stopped by `torchlab-tui stop` (at the end of this step, with a final checkpoint)"),
]
EVENTS = [event for event, _ in SAID]


def test_the_worker_sends_the_app_these_events_as_they_are_not_as_log_lines():
    outbox = Outbox()
    reporter = OutboxReporter(outbox)
    for event in EVENTS:
        reporter.on_event(event)
    sent = [message for message in outbox.take_past(Cursor()) if not isinstance(message, (p.State, p.Replayed))]
    assert sent == EVENTS


def test_the_apps_event_log_says_each_in_the_words_headless_prints():
    state = RunState()
    state.apply_all(past_ended([welcome(0), *EVENTS]))
    logged = [entry for entry in state.take_log() if not entry.text.startswith("connected to the trainer")]
    console = Console(file=io.StringIO(), width=300, color_system=None)
    progress = HeadlessProgress(100, console)
    for event in EVENTS:
        progress.on_event(event)
    printed = console.file.getvalue().splitlines()
    assert printed == [f"step {event.step}: {said}" for event, said in SAID]
    assert [(entry.level, entry.step, entry.text) for entry in logged] == [
        ("warning" if said.startswith("warning: ") else "info", event.step, said.removeprefix("warning: "))
        for event, said in SAID]
