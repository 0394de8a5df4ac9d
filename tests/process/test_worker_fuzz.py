"""The trainer never dies from a message: hypothesis sends the app's connection garbage and odd commands."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from test_worker import TINY, link_for  # noqa: F401  (link_for is a fixture)
from torchlab.core import protocol as p

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


def test_garbage_and_odd_commands_from_the_app_never_stop_the_trainer(link_for):
    link, seen = link_for(f"{TINY}:workload", "--steps", "1000000", "--checkpoint-every", "0")
    seen.until(lambda m: isinstance(m, p.Metrics))

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(lines, min_size=1, max_size=5))
    def send(batch):
        for line in batch:
            link._socket.sendall(line)

    send()
    link.send(p.ResumeCommand())  # a fuzzed pause may have paused it
    link.send(p.SetCommand(option="accum", value="3"))
    applied = seen.until(lambda m: isinstance(m, p.OptionApplied) and m.option == "accum" and m.value == 3)
    assert link.process.poll() is None
    assert seen.of(p.Refused), "the garbage was answered with refusals"
    seen.until(lambda m: isinstance(m, p.Metrics) and m.records[-1]["step"] > applied.step)  # still training
