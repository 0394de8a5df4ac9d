"""What held a run's ranks back, over the whole run (core/records/rank_history.py): each stretch a rank straggled, from
the verdict's first step to the one that cleared it, and each hung step, from the journal's records; a record this
version cannot read is left out, not fatal."""

from __future__ import annotations

from torchlab.core.records.rank_history import RankHistory, rank_event
from torchlab.core.wire.hang import Hang
from torchlab.core.wire.straggler import Straggler

SLOW = Straggler(step=120, rank=1, host="node-b", excess_s=0.05, step_share=0.2, since_step=88, part="data wait")


def test_stretches_and_hangs_in_the_order_said_and_an_unreadable_record_left_out():
    records = [record.journal_record() for record in (
        SLOW, Straggler(**{**SLOW.__dict__, "step": 140}),  # said again while it holds: the same stretch
        Straggler(**{**SLOW.__dict__, "step": 200, "cleared": True}),
        Hang(step=412, waited_s=41.0, explanation="rank 2 at model.py:88", folder="hangs/step-0000412"),
        Straggler(**{**SLOW.__dict__, "rank": 3, "host": "", "step": 500, "since_step": 470, "part": "forward"}),
    )]
    records.insert(1, {"event": "straggler", "step": "soon"})  # another version's, or edited by hand
    assert rank_event(records[1]) is None
    assert RankHistory.of(records).sentence() == (
        "rank 1 (node-b) straggled steps 88–200 (data wait); rank 3 straggled from step 470 (forward); hung at step 412")


def test_a_run_nothing_held_back_says_nothing():
    assert RankHistory.of([{"event": "run_started", "step": 0}]).sentence() is None
