"""The trainer never dies from a message: hypothesis sends the app's connection garbage and odd commands,
and strangers' connections the same as their first line (issue 12, item 2): oversized numbers, deep
nesting, invalid UTF-8, lines at and over the length cap. After each fuzz the trainer trains on and obeys,
every refusal is short, and the journal holds refused lines, a burst a minute, short, never a traceback."""

from __future__ import annotations

import json
import socket

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from test_worker import TINY, link_for  # noqa: F401  (link_for is a fixture)
from torchlab.core.wire import protocol as p
from torchlab.core.wire.throttle import Throttle
from torchlab.core.wire.protocol import PROTOCOL_VERSION

#: How a line of the protocol begins: its version (a test's line stays one of today's when it moves on).
V = f'{{"v": {PROTOCOL_VERSION}'.encode()

COMMAND_TYPES = [kind for kind in (c.type for c in p.COMMANDS) if kind != "stop"] + ["metrics", "welcome", "refused", "", "x" * 40]
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20)),
    lambda children: st.one_of(st.lists(children, max_size=3), st.dictionaries(st.text(max_size=8), children, max_size=3)),
    max_leaves=6,
)
field_names = st.sampled_from(["option", "value", "steps", "token", "version", "client", "v", "type", "extra"])
options_but_world_size = st.sampled_from([name for name in ("amp", "checkpointing", "clip", "accum", "lr_scale", "bogus")])


def _command(kind, fields, option):
    body = {"v": p.PROTOCOL_VERSION, "type": kind, **fields}
    if kind == "set":
        body["option"] = option  # world_size would relaunch ranks: a real change, not garbage
    return (json.dumps(body) + "\n").encode()


lines = st.one_of(
    st.binary(max_size=120).map(lambda raw: raw.replace(b"\n", b" ") + b"\n"),
    st.builds(_command, st.sampled_from(COMMAND_TYPES), st.dictionaries(field_names, json_values, max_size=4), options_but_world_size),
    st.builds(lambda v: (json.dumps({"v": v, "type": "pause"}) + "\n").encode(), json_values),
)


#: Numbers JSON can spell that Python reads badly: past the int-string limit, past float's range, -0,
#: and integers float() cannot take (an OverflowError at the step boundary once failed the run).
odd_numbers = st.sampled_from(["9" * 5000, "-" + "9" * 4301, "9" * 400, "1e999", "-1e999", "-0", "-0.0", "1e308",
                               "1.7976931348623157e308", "4.9e-324", "1" + "0" * 4299, "0." + "0" * 5000 + "1"])
numbered = st.builds(
    lambda template, number: template.replace("V", str(p.PROTOCOL_VERSION)).replace("N", number).encode() + b"\n", st.sampled_from([
        '{"v": V, "type": "set", "option": "clip", "value": N}', '{"v": V, "type": "set", "option": "lr_scale", "value": N}',
        '{"v": V, "type": "set", "option": "accum", "value": N}', '{"v": V, "type": "profile", "steps": N}',
        '{"v": N, "type": "pause"}', '{"v": V, "type": N}', '{"v": V, "type": "hello", "version": N, "token": "x"}',
        '{"v": V, "type": "pause", "N": 1}', "N", "[N]"]), odd_numbers)
DEEP = 100_000
deep_nesting = st.sampled_from([
    b"[" * DEEP + b"\n", b"[" * DEEP + b"]" * DEEP + b"\n", b'{"a":' * DEEP + b"1" + b"}" * DEEP + b"\n",
    V + b', "type": "set", "option": "clip", "value": ' + b"[" * DEEP + b"]" * DEEP + b"}\n",
    V + b', "type": ' + b"[" * 500 + b"]" * 500 + b"}\n",  # deep enough to read, echoed cut short
])
invalid_utf8 = st.builds(lambda raw, at: (V + b', "type": "set", "option": "clip", "value": "' + raw + b'"}')[:at] + raw + b"\n",
                         st.sampled_from([b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80"]),
                         st.integers(0, 60))
#: At the cap (read and refused as JSON) and one byte over it (refused as too long).
at_the_cap = st.sampled_from([b"x" * p.MAX_LINE_BYTES + b"\n", b"x" * (p.MAX_LINE_BYTES + 1) + b"\n",
                              b" " * (p.MAX_LINE_BYTES - 2) + b"{}\n", b"[" * (p.MAX_LINE_BYTES + 1) + b"\n"])
hostile_lines = st.one_of(numbered, deep_nesting, invalid_utf8, at_the_cap)
#: Before the hello a stranger may also send a line and hang up before its newline.
first_lines = st.one_of(hostile_lines, lines).flatmap(
    lambda line: st.sampled_from([line, line.rstrip(b"\n")]))

REASON_CHARS = 300
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))


def trains_on_and_obeys(link, seen, accum: int) -> None:
    """The trainer is alive, applies a valid command, and reports steps after it."""
    link.send(p.ResumeCommand())  # a fuzzed pause may have paused it
    link.send(p.SetCommand(option="accum", value=str(accum)))
    applied = seen.until(lambda m: isinstance(m, p.OptionApplied) and m.option == "accum" and m.value == accum)
    seen.until(lambda m: isinstance(m, p.Metrics) and m.rows[-1].step > applied.step)
    assert link.process.poll() is None


def journal_is_clean(link) -> list[dict]:
    """No traceback anywhere, every line that may echo a peer short, refused lines at most a burst in any minute (two windows of
    the throttle may meet in one); returns the line_refused records."""
    text = (link.run_dir / "events.jsonl").read_text()
    assert "Traceback" not in text and "Traceback" not in link.log_path.read_text()
    events = [json.loads(line) for line in text.splitlines()]
    echoing = [line for line, event in zip(text.splitlines(), events) if event["event"] != "profile"]  # a profile's tables are long
    assert max(len(line) for line in echoing) < 4000, "something was echoed into the journal"
    assert not [e for e in events if e["event"] == "error"]
    refused = [e for e in events if e["event"] == "line_refused"]
    burst = Throttle().burst
    for record in refused:
        assert len([r for r in refused if record["time"] <= r["time"] < record["time"] + 60]) <= 2 * burst
        assert len(record["reason"]) <= REASON_CHARS and record["channel"] == "app socket"
    return refused


@pytest.mark.parametrize("batches", [
    st.lists(lines, min_size=1, max_size=5),  # garbage and odd commands
    st.lists(hostile_lines, min_size=1, max_size=3),  # oversized numbers, deep nesting, invalid UTF-8, lines at and over the cap
], ids=["odd-commands", "hostile-lines"])
def test_lines_from_the_app_are_refused_and_the_trainer_trains_on(link_for, batches):
    """On the app's own connection, each bad line is refused (the connection stays: closing it would be the
    app leaving, which stops the run), and the trainer trains on and obeys."""
    link, seen = link_for(f"{TINY}:workload", "--steps", "1000000", "--checkpoint-every", "0")
    seen.until(lambda m: isinstance(m, p.Metrics))

    @FUZZ
    @given(batches)
    def send(batch):
        for line in batch:
            link._socket.sendall(line)

    send()
    trains_on_and_obeys(link, seen, accum=3)
    assert seen.of(p.Refused), "the garbage was answered with refusals"
    assert all(len(m.reason) <= REASON_CHARS for m in seen.of(p.Refused))
    assert any(r["before_hello"] is False for r in journal_is_clean(link))


def test_hostile_first_lines_from_strangers_end_only_their_connections(link_for):
    """A fresh connection's first line, hostile or cut off by a hang-up: answered with a short Refused, or
    closed, and the app attached meanwhile keeps its run."""
    link, seen = link_for(f"{TINY}:workload", "--steps", "1000000", "--checkpoint-every", "0")
    seen.until(lambda m: isinstance(m, p.Metrics))

    @FUZZ
    @given(first_lines)
    def connect_and_send(line):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stranger:
            stranger.settimeout(30)
            stranger.connect(str(link._endpoint.socket_path))
            try:
                stranger.sendall(line)
                stranger.shutdown(socket.SHUT_WR)  # a line without its newline ends here
                answer = stranger.makefile("rb").readline()
            except (BrokenPipeError, ConnectionResetError):  # refused and closed before all of a long line was sent
                return
            if answer:
                refused = p.decode(answer)
                assert refused.type == "refused" and len(refused.reason) <= REASON_CHARS

    connect_and_send()
    trains_on_and_obeys(link, seen, accum=3)
    assert any(r["before_hello"] is True for r in journal_is_clean(link))
