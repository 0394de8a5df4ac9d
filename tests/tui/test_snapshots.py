"""What the main screen looks like, with deterministic FakeLink data, at a small and a large terminal.

Plain (non-async) tests, as pytest-textual-snapshot requires. After ``--snapshot-update``, look at the
SVGs under ``__snapshots__/`` before accepting them.
"""

from __future__ import annotations

from fake_link import FakeLink, quiet_app

from torchlab.core import protocol
from torchlab.tui.app import TorchlabApp
from textual.widgets import Input


def snapshot_app() -> TorchlabApp:
    return quiet_app(FakeLink())


async def settle(pilot) -> None:
    # run_before runs before the first layout: let it happen.
    await pilot.pause()
    await pilot.pause()


async def change_options(pilot) -> None:
    """a (bf16, applied), a (fp16, refused on CPU), c (checkpointing on), then the answers arrive."""
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
