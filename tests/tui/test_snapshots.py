"""What the main screen looks like, with deterministic FakeLink data, at a small and a large terminal.

Plain (non-async) tests, as pytest-textual-snapshot requires. After ``--snapshot-update``, look at the
SVGs under ``__snapshots__/`` before accepting them.
"""

from __future__ import annotations

from fake_link import (
    FakeLink, gpu, impact, long_names_events, memory_predicted, profile_ready, quiet_app, ranks, telemetry, training_events,
)

from torchlab.core.wire import protocol
from torchlab.tui.app import TorchlabApp
from textual.widgets import Input


def system_samples(gpus: int = 0) -> list[protocol.Message]:
    """A minute of telemetry with the trainer's memory growing: the system panel's figures and history."""
    return [
        telemetry(gpus=[gpu(index, used_gib=30 + second / 6) for index in range(gpus)], rss_mib=700 + 2 * second, t=second)
        for second in range(60)
    ]


def snapshot_app(*extra: protocol.Message, gpus: int = 0, world_size: int = 1) -> TorchlabApp:
    link = FakeLink(training_events(world_size=world_size) + system_samples(gpus) + list(extra))
    link.options["world_size"] = world_size
    return quiet_app(link)


def two_ranks_app() -> TorchlabApp:
    """World size 2, rank 1 waiting 50 ms for its batches (a straggler)."""
    return snapshot_app(ranks(120, slow={1: {"data_wait_s": 0.05}}), world_size=2)


def profiled_app() -> TorchlabApp:
    """Two profiler snapshots, the second with matmuls twice as fast; and the impact of amp=bf16."""
    return snapshot_app(profile_ready(12), profile_ready(150, scale=0.5), impact())


async def settle(pilot) -> None:
    # run_before runs before the first layout: let it happen.
    await pilot.pause()
    await pilot.pause()


async def change_options(pilot) -> None:
    """a (bf16, applied), a (off: fp16 skipped on CPU, saying why), c (checkpointing on), then the answers arrive."""
    await settle(pilot)
    await pilot.press("a")
    pilot.app.poll_now()
    await pilot.press("a", "c")
    pilot.app.poll_now()
    await settle(pilot)


async def open_clip_prompt_with_a_bad_value(pilot) -> None:
    await settle(pilot)
    await pilot.press("g")
    await pilot.pause()
    pilot.app.screen.query_one(Input).cursor_blink = False
    await pilot.press("backspace", "-", "1", "enter")
    await settle(pilot)


async def fail_with_a_traceback(pilot) -> None:
    await settle(pilot)
    link = pilot.app.link
    link.push(
        protocol.Error(
            "RuntimeError: mat1 and mat2 shapes cannot be multiplied (32x64 and 128x10)",
            'Traceback (most recent call last):\n  File "model.py", line 42, in forward\n    return self.head(x)\n'
            "RuntimeError: mat1 and mat2 shapes cannot be multiplied (32x64 and 128x10)",
            121,
            "runs/20250101-120000-tiny_gpt/checkpoints/last.pt",
        )
    )
    pilot.app.poll_now()
    await settle(pilot)


def test_main_screen_80x24(snap_compare) -> None:
    assert snap_compare(snapshot_app(), terminal_size=(80, 24), run_before=settle)


def test_main_screen_160x48(snap_compare) -> None:
    assert snap_compare(snapshot_app(), terminal_size=(160, 48), run_before=settle)


def test_acknowledgements_and_refusals_160x48(snap_compare) -> None:
    assert snap_compare(snapshot_app(), terminal_size=(160, 48), run_before=change_options)


def test_acknowledgements_and_refusals_80x24(snap_compare) -> None:
    assert snap_compare(snapshot_app(), terminal_size=(80, 24), run_before=change_options)


def test_prompt_says_what_is_wrong_80x24(snap_compare) -> None:
    assert snap_compare(snapshot_app(), terminal_size=(80, 24), run_before=open_clip_prompt_with_a_bad_value)


def test_error_screen_80x24(snap_compare) -> None:
    assert snap_compare(snapshot_app(), terminal_size=(80, 24), run_before=fail_with_a_traceback)


def test_main_screen_with_a_gpu_and_an_impact_verdict_160x48(snap_compare) -> None:
    assert snap_compare(snapshot_app(impact(), gpus=1), terminal_size=(160, 48), run_before=settle)


def test_main_screen_with_two_ranks_80x24(snap_compare) -> None:
    assert snap_compare(two_ranks_app(), terminal_size=(80, 24), run_before=settle)


def test_main_screen_with_two_ranks_160x48(snap_compare) -> None:
    assert snap_compare(two_ranks_app(), terminal_size=(160, 48), run_before=settle)


async def relaunch_to_one_rank(pilot) -> None:
    """w 1: the trainer has checkpointed and is starting the new rank (it reports nothing meanwhile)."""
    await settle(pilot)
    await pilot.press("w", "1", "enter")
    pilot.app.poll_now()
    await settle(pilot)


def test_relaunching_80x24(snap_compare) -> None:
    assert snap_compare(two_ranks_app(), terminal_size=(80, 24), run_before=relaunch_to_one_rank)


async def open_first_profile(pilot) -> None:
    await settle(pilot)
    await pilot.press("P", "up", "enter")
    await settle(pilot)


async def compare_profiles(pilot) -> None:
    await settle(pilot)
    await pilot.press("P", "c")
    await settle(pilot)


def opening(key: str):
    """A ``run_before`` that opens the view ``key`` opens, the screen settled before and after."""
    async def run_before(pilot) -> None:
        await settle(pilot)
        await pilot.press(key)
        await settle(pilot)

    return run_before


def test_profile_table_80x24(snap_compare) -> None:
    assert snap_compare(profiled_app(), terminal_size=(80, 24), run_before=open_first_profile)


def test_profile_compare_80x24(snap_compare) -> None:
    assert snap_compare(profiled_app(), terminal_size=(80, 24), run_before=compare_profiles)


def impact_app() -> TorchlabApp:
    """Three segments: the start, amp=bf16 clearly faster, then clip=1.0 within the noise of bf16."""
    return snapshot_app(impact(bf16_steps=40, clip_steps=30))


def test_impact_screen_80x24(snap_compare) -> None:
    assert snap_compare(impact_app(), terminal_size=(80, 24), run_before=opening("i"))


def test_impact_screen_160x48(snap_compare) -> None:
    assert snap_compare(impact_app(), terminal_size=(160, 48), run_before=opening("i"))


def what_fits_app() -> TorchlabApp:
    """The forecaster's answers for a run at its defaults: the longest change's name, a setting that cannot run here
    (its reason under the table, not in a column that pushes the figures off an 80-column screen), one that does not
    fit."""
    return snapshot_app(
        memory_predicted("in force", 61.2),
        memory_predicted("batch_size=64", 112, "no", batch_size=64),
        memory_predicted("amp=bf16", 48.1, amp="bf16"),
        memory_predicted("amp=fp16", 0, refused="fp16 needs CUDA; this run is on cpu: use bf16", amp="fp16"),
        memory_predicted("checkpointing=on", 26.9, checkpointing=True),
        memory_predicted("amp=bf16, checkpointing=on", 22.9, amp="bf16", checkpointing=True),
        memory_predicted("world_size=8, parallel=fsdp", 75, "tight", world_size=8, parallel="fsdp"),
    )


def test_what_fits_80x24(snap_compare) -> None:
    assert snap_compare(what_fits_app(), terminal_size=(80, 24), run_before=opening("F"))


def long_names_app() -> TorchlabApp:
    """HuggingFace BERT's module names (tests/workloads/long_names.py, as its trainer names them), a tied lm_head."""
    return quiet_app(FakeLink(long_names_events() + system_samples()))


def test_long_similar_module_names_80x24(snap_compare) -> None:
    assert snap_compare(long_names_app(), terminal_size=(80, 24), run_before=settle)


def test_long_similar_module_names_160x48(snap_compare) -> None:
    assert snap_compare(long_names_app(), terminal_size=(160, 48), run_before=settle)


def heatmap_app() -> TorchlabApp:
    """Grad norms with their updates' figures: blocks.2's updates ten times larger from step 80."""
    return quiet_app(FakeLink(training_events(updates=True) + system_samples()))


async def open_heatmap(pilot) -> None:
    await settle(pilot)
    await pilot.press("H")
    await settle(pilot)
    await pilot.press("up", "left", "left")
    await settle(pilot)


def test_heatmap_80x24(snap_compare) -> None:
    assert snap_compare(heatmap_app(), terminal_size=(80, 24), run_before=open_heatmap)


def test_heatmap_200x50(snap_compare) -> None:
    assert snap_compare(heatmap_app(), terminal_size=(200, 50), run_before=open_heatmap)
