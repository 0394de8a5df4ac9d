"""A straggler named for real: two ranks, rank 1's data path 15 ms slower a batch (tests/workloads/tiny.py
``slow_data_on_rank_1``): within the verdict's window of gathers (the probe's cadence) the journal and the terminal
name rank 1 and its data wait, and each rank's phases since the last gather come with its figures."""

from __future__ import annotations

from test_ranks import TINY, headless, read_jsonl
from torchlab.core.analysis.stragglers import WINDOW
from torchlab.core.errors import EXIT_OK

PROBE_EVERY = 4


def test_a_rank_whose_data_path_is_slow_is_named_a_straggler_within_the_window(tmp_path, capsys):
    run = tmp_path / "run"
    steps = PROBE_EVERY * (WINDOW + 4)
    assert headless(run, f"{TINY}:slow_data_on_rank_1", "--world-size", "2", "--steps", str(steps),
                    "--probe-every", str(PROBE_EVERY), "--checkpoint-every", "0") == EXIT_OK
    [verdict] = [event for event in read_jsonl(run / "events.jsonl") if event["event"] == "straggler"]
    assert (verdict["rank"], verdict["part"], verdict["cleared"]) == (1, "data wait", False)
    assert verdict["excess_s"] > 0.01 and verdict["step"] <= PROBE_EVERY * (WINDOW + 2)  # within the window, give or take
    assert "straggler: rank 1 (" in capsys.readouterr().err
    with_phases = [row["ranks"] for row in read_jsonl(run / "metrics.jsonl") if "ranks" in row]
    assert all(rank["forward_s"] > 0 and rank["backward_s"] > 0 for ranks in with_phases[1:] for rank in ranks)
    assert all(0 <= rank["host_cpu_percent"] <= 100 and rank["host_available_bytes"] > 0  # each rank's machine
               for ranks in with_phases[1:] for rank in ranks)
    waits = [[rank["data_wait_s"] for rank in ranks] for ranks in with_phases]
    assert all(slow > fast + 0.01 for fast, slow in waits[1:])  # rank 1's 15 ms, rank 0's none
