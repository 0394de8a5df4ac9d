"""Issue 12, item 2: no line on the app's socket can stop a run. A line that cannot be read is refused on
that connection (after the hello) or ends that one connection (before it); the trainer trains on, and the
next valid command works."""

from __future__ import annotations

import json
import socket
import time

from test_worker import TINY, link_for  # noqa: F401  (link_for is a fixture)
from torchlab.core.wire import protocol as p
from torchlab.core.wire.throttle import Throttle

#: Python refuses to read an integer of more than 4,300 digits (int-string limit): json.loads raised ValueError.
HUGE_NUMBER = "9" * 5000
THROTTLE_BURST = Throttle().burst  # the worker's


def set_line(value_json: str) -> bytes:
    return f'{{"v": {p.PROTOCOL_VERSION}, "type": "set", "option": "clip", "value": {value_json}}}\n'.encode()


def test_after_the_hello_an_unreadable_or_oversized_set_is_refused_and_the_run_trains_on(link_for):
    link, seen = link_for(f"{TINY}:workload", "--steps", "1000000", "--checkpoint-every", "0")
    seen.until(lambda m: isinstance(m, p.Metrics))
    link._socket.sendall(set_line(HUGE_NUMBER))
    refused = seen.until(lambda m: isinstance(m, p.Refused))
    assert "number too long" in refused.reason
    link._socket.sendall(set_line(json.dumps("1" * 2000)))
    seen.until(lambda m: isinstance(m, p.Refused) and "set.value: longer than 256 characters" in m.reason)

    link.send(p.SetCommand(option="accum", value="2"))
    applied = seen.until(lambda m: isinstance(m, p.OptionApplied) and m.option == "accum")
    seen.until(lambda m: isinstance(m, p.Metrics) and m.rows[-1].step > applied.step)  # still training
    assert link.process.poll() is None
    journal = (link.run_dir / "events.jsonl").read_text().splitlines()
    assert max(len(line) for line in journal) < 4000, "a value was echoed into the journal"


def test_before_the_hello_an_unreadable_line_ends_only_that_connection(link_for):
    link, seen = link_for(f"{TINY}:workload", "--steps", "1000000", "--checkpoint-every", "0")
    seen.until(lambda m: isinstance(m, p.Metrics))
    for line in (set_line(HUGE_NUMBER), b"\xff\xfe not utf-8\n", b"[" * 100_000 + b"\n"):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stranger:
            stranger.settimeout(30)
            stranger.connect(str(link._endpoint.socket_path))
            stranger.sendall(line)
            answer = stranger.makefile("rb").readline()
            assert answer and p.decode(answer).type == "refused"  # then the trainer closed this connection
    link.send(p.SetCommand(option="accum", value="2"))
    applied = seen.until(lambda m: isinstance(m, p.OptionApplied) and m.option == "accum")
    seen.until(lambda m: isinstance(m, p.Metrics) and m.rows[-1].step > applied.step)
    assert link.process.poll() is None


def journal(link) -> list[dict]:
    return [json.loads(line) for line in (link.run_dir / "events.jsonl").read_text().splitlines()]


def refusals_in(link) -> list[dict]:
    return [event for event in journal(link) if event["event"] == "line_refused"]


def until_journalled(link, predicate, timeout: float = 60.0) -> list[dict]:
    """The journal's line_refused records once ``predicate`` holds for them (they are written on the
    connection's thread, after the answer went out)."""
    deadline = time.monotonic() + timeout
    while not predicate(records := refusals_in(link)):
        assert time.monotonic() < deadline, f"timed out; journalled: {records[-3:]}"
        link.arrived.wait(0.2)
    return records


def test_refused_lines_are_journalled_a_burst_a_minute_before_and_after_the_hello(link_for):
    """A refused line is answered and written to events.jsonl (who spoke nonsense to the run, and when); a
    flood of them reaches the journal at most a burst per minute (core/wire/throttle.py), the rest counted."""
    link, seen = link_for(f"{TINY}:workload", "--steps", "1000000", "--checkpoint-every", "0")
    seen.until(lambda m: isinstance(m, p.Metrics))
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stranger:
        stranger.settimeout(30)
        stranger.connect(str(link._endpoint.socket_path))
        stranger.sendall(f'{{"v": {p.PROTOCOL_VERSION}, "type": "'.encode() + b"x" * 100_000 + b'"}\n')
        assert p.decode(stranger.makefile("rb").readline()).type == "refused"
    [first] = until_journalled(link, lambda records: len(records) == 1)
    assert first["before_hello"] is True and first["channel"] == "app socket" and first["held_back"] == 0
    assert first["reason"].startswith("expected a hello with a token first: unknown message type 'xxx")
    assert len(first["reason"]) < 300 and isinstance(first["step"], int) and first["step"] > 0

    flood = 200
    for _ in range(flood):
        link._socket.sendall(b"\x00 not json\n")
    seen.until(lambda m: len(seen.of(p.Refused)) >= flood)  # every line is answered...
    records = until_journalled(link, lambda records: len(records) >= THROTTLE_BURST)
    assert len(records) == THROTTLE_BURST  # ...but the journal takes a burst (this test ends within a minute)
    assert [r["before_hello"] for r in records[1:]] == [False] * (THROTTLE_BURST - 1)
    assert all(r["reason"] == "message is not valid JSON (or holds a number too long to read, or nests too deep)" for r in records[1:])
    link.send(p.SetCommand(option="accum", value="2"))
    applied = seen.until(lambda m: isinstance(m, p.OptionApplied) and m.option == "accum")
    seen.until(lambda m: isinstance(m, p.Metrics) and m.rows[-1].step > applied.step)
    assert link.close(grace_s=60) == 0  # the run ends: what the journal held back is counted there
    events = [json.loads(line) for line in (link.run_dir / "events.jsonl").read_text().splitlines()]
    refused = [e for e in events if e["event"] == "line_refused"]
    [unrecorded] = [e for e in events if e["event"] == "lines_refused_unrecorded"]
    assert len(refused) + sum(r["held_back"] for r in refused) + unrecorded["count"] == flood + 1  # and the stranger's


def test_a_number_too_large_for_any_option_is_refused_not_a_failed_run(link_for):
    """A 400-digit integer reads as JSON and passed every bound: float() of it raised OverflowError at the
    step boundary, and the run failed. It is refused before the trainer sees it."""
    link, seen = link_for(f"{TINY}:workload", "--steps", "1000000", "--checkpoint-every", "0")
    seen.until(lambda m: isinstance(m, p.Metrics))
    for option in ("lr_scale", "clip"):
        link._socket.sendall(set_line("9" * 400).replace(b'"clip"', f'"{option}"'.encode()))
    link._socket.sendall(f'{{"v": {p.PROTOCOL_VERSION}, "type": "profile", "steps": {"9" * 4000}}}\n'.encode())
    seen.until(lambda m: len(seen.of(p.Refused)) == 3)
    assert all("is out of range" in m.reason and len(m.reason) < 300 for m in seen.of(p.Refused))
    link.send(p.SetCommand(option="accum", value="2"))
    applied = seen.until(lambda m: isinstance(m, p.OptionApplied) and m.option == "accum")
    seen.until(lambda m: isinstance(m, p.Metrics) and m.rows[-1].step > applied.step)
    assert not seen.of(p.Error) and link.process.poll() is None
    assert max(len(line) for line in (link.run_dir / "events.jsonl").read_text().splitlines()) < 4000


def test_a_flood_of_sets_the_trainer_refuses_reaches_the_journal_as_a_burst_and_a_count(link_for):
    """Lines refused on the socket were held to a burst a minute in events.jsonl; a `set` of an unknown option
    reads as a valid command, and the trainer's refusal of it was journalled every time: a flood of them added
    2.5 MB/s to the journal. Every refusal a peer can cause reaches the journal by the one rule."""
    link, seen = link_for(f"{TINY}:workload", "--steps", "1000000", "--checkpoint-every", "0")
    seen.until(lambda m: isinstance(m, p.Metrics))
    flood = 2000
    link._socket.sendall(b"".join(p.SetCommand(option=f"no_such_option_{n}", value=1).encode() for n in range(flood)))
    seen.until(lambda m: len(seen.of(p.OptionRefused)) == flood)  # the app is told of each one
    assert "unknown" in seen.of(p.OptionRefused)[0].reason
    journalled = [e for e in journal(link) if e["event"] == "option_refused"]
    assert len(journalled) == THROTTLE_BURST
    assert link.close(grace_s=60) == 0
    [unrecorded] = [e for e in journal(link) if e["event"] == "lines_refused_unrecorded"]
    assert unrecorded["count"] == flood - THROTTLE_BURST and unrecorded["channel"] == "commands"
    assert len(journal(link)) < 200
