"""Every reader of what a trainer says takes every event it can say: the list is the protocol's registry, each with
its example (test_protocol.py EXAMPLES, which must cover the registry), so a new event cannot break an old reader.

``torchlab-tui stop`` decoded with a registry that lacked the trainer's own events (core/wire/events.py registers
them when imported, and stop imported only the protocol): a run's ``stop_requested`` ended the command in
``ProtocolError: unknown message type 'stop_requested'``, exit 1, although the run had stopped.

The readers: of the socket, the app's link and state (``attach`` opens the same link on a running trainer) and
``stop``; of the trainer's observers, headless's progress, the live TensorBoard writer, the run's journal and the
rank channel (rank 0 to its supervisor); of the journal, ``export`` and ``compare``.
"""

from __future__ import annotations

import io
import json
import socket
import subprocess
import sys
import time
from dataclasses import replace

import pytest
from rich.console import Console

from metrics_rows import metrics_row
from test_protocol import EXAMPLES
from torchlab.core.engine.ranks.channel_messages import EventReport, RankMessage
from torchlab.core.launch.cli import main
from torchlab.core.launch.headless import HeadlessProgress
from torchlab.core.launch.stop import Ending, _until_closed
from torchlab.core.records.rundir import RunDirectory
from torchlab.core.records.rundir_folder import create_run_dir
from torchlab.core.wire import protocol as p
from torchlab.core.wire.events import TRAINER_EVENTS
from torchlab.core.wire.line_reader import LineReader
from torchlab.tui.link import ProcessLink
from torchlab.tui.run_history import RunHistory
from torchlab.tui.state import RunState

COMMANDS = (p.Hello, p.TrainerCommand, p.DetachCommand)
#: Every message a trainer may send, by type: the registry less the commands that go the other way.
EVENT_TYPES = sorted(kind for kind, cls in p.Message.registry.items() if not issubclass(cls, COMMANDS))
EXAMPLE_OF = {message.type: message for message in EXAMPLES}
#: What a trainer's observers (the worker, headless, the journal, the rank channel) are handed.
OBSERVED = sorted(kind.type for kind in TRAINER_EVENTS)


def example(kind: str) -> p.Message:
    assert kind in EXAMPLE_OF, f"no example of {kind!r}: add one to EXAMPLES in tests/wire/test_protocol.py"
    return EXAMPLE_OF[kind]


def test_the_protocol_alone_decodes_every_event():
    """Whatever a process imports, the registry it decodes with is whole: here, a process that imports the protocol
    and nothing else (as ``stop`` did)."""
    registered = subprocess.run(
        [sys.executable, "-c", "from torchlab.core.wire import protocol; print(*sorted(protocol.Message.registry))"],
        capture_output=True, text=True, check=True).stdout.split()
    assert registered == sorted(p.Message.registry)


@pytest.mark.parametrize("kind", EVENT_TYPES)
def test_the_apps_link_and_state_read_it(kind, tmp_path):
    event = example(kind)
    link = ProcessLink(tmp_path, [])  # ``attach`` makes this same link, on a trainer it did not start
    link._accept_line(event.encode().rstrip(b"\n"))
    assert link.drain() == [event]
    welcome = replace(EXAMPLE_OF["welcome"], modules=[p.ModuleInfo(f"m{index}", 10) for index in range(3)])
    state = RunState()
    state.apply_all([welcome, p.Replayed(events=0), event])
    unread = [entry.text for entry in state.take_log() if "could not read" in entry.text]
    assert unread == []


@pytest.mark.parametrize("kind", EVENT_TYPES)
def test_stop_reads_it_until_the_trainer_closes(kind):
    trainer, client = socket.socketpair()
    with trainer, client:
        trainer.sendall(example(kind).encode())
        trainer.close()
        assert _until_closed(LineReader(client, p.MAX_LINE_BYTES), Ending(), "run") is True


@pytest.mark.parametrize("kind", OBSERVED)
def test_headless_and_the_rank_channel_read_it(kind):
    event = example(kind)
    HeadlessProgress(100, Console(file=io.StringIO())).on_event(event)
    report = p.decode(EventReport.of(event).encode(), RankMessage)  # rank 0's line, as its supervisor reads it
    assert report.as_event() == event


def test_a_journal_of_every_event_is_written_exported_and_compared(tmp_path, capsys):
    """The journal's writer, the live and the later TensorBoard export, and ``compare`` take a run that said all of it."""
    from torchlab.core.engine.measure.tensorboard import LiveTensorBoard  # imports torch

    runs = []
    for name in ("a", "b"):
        run = create_run_dir(tmp_path / name)
        journal, live = RunDirectory(run), LiveTensorBoard(tmp_path / f"live-{name}")
        for observer in (journal, live):
            observer.on_metrics(metrics_row(1, loss=2.0))
            for kind in OBSERVED:
                observer.on_event(example(kind))
            observer.close()
        runs.append(run)
    journalled = {json.loads(line)["event"] for line in (runs[0] / "events.jsonl").read_text().splitlines()}
    assert journalled == {example(kind).journal_name or kind for kind in OBSERVED if example(kind).journalled}
    assert main(["export", str(runs[0]), "--tensorboard", str(tmp_path / "tb")]) == 0
    assert "1 option changes" in capsys.readouterr().err
    assert [history.changes for history in map(RunHistory.load, runs)] == [["step 8: amp = bf16"]] * 2


def test_a_run_of_another_release_is_said_so_by_stop_and_attach_not_a_traceback_or_a_failure(tmp_path):
    """Found as a user after an upgrade: `stop` on a run started by the release before ended in a traceback
    ('ProtocolError: protocol version 14 is not supported'), and `attach` reported the run as failed at step 0."""
    from torchlab.core.launch.stop import StopRefused, _answer

    older = json.dumps({"v": p.PROTOCOL_VERSION - 1, "type": "refused", "reason": "protocol version ..."}).encode()
    trainer, client = socket.socketpair()
    with trainer, client:
        trainer.sendall(older + b"\n")
        with pytest.raises(StopRefused, match=r"^run was started by another version of torchlab-tui .* \(kill 42\)"):
            _answer(LineReader(client, p.MAX_LINE_BYTES), Ending(), time.monotonic() + 30, "run", 42)
    link = ProcessLink(tmp_path, [])
    link._accept_line(older)
    assert link.drain() == [] and link.refused.startswith("the run was started by another version of torchlab-tui")
