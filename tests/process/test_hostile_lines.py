"""Issue 12, item 2: no line on the app's socket can stop a run. A line that cannot be read is refused on
that connection (after the hello) or ends that one connection (before it); the trainer trains on, and the
next valid command works."""

from __future__ import annotations

import json
import socket

from test_worker import TINY, link_for  # noqa: F401  (link_for is a fixture)
from torchlab.core import protocol as p

#: Python refuses to read an integer of more than 4,300 digits (int-string limit): json.loads raised ValueError.
HUGE_NUMBER = "9" * 5000


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
    seen.until(lambda m: isinstance(m, p.Metrics) and m.records[-1]["step"] > applied.step)  # still training
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
    seen.until(lambda m: isinstance(m, p.Metrics) and m.records[-1]["step"] > applied.step)
    assert link.process.poll() is None
