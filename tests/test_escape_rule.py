"""The escape rule: a name or path the user gave (or someone else chose) is shown with its control characters escaped,
in every message of every command, never sent to the terminal as they are. A workload path, ``--config``,
``--resume``, ``--run-dir``, ``export RUN`` and ``compare RUN`` holding ``\\x1b]0;PWNED\\x07`` retitled the terminal
of whoever read the error; a headless run's "Run directory" line wrote the ESC through Rich."""

from __future__ import annotations

import pytest

from torchlab.core.errors import EXIT_OK, EXIT_USAGE, printable
from torchlab.core.launch.cli import main

#: An OSC that retitles an xterm, between two letters.
HOSTILE = "x\x1b]0;PWNED\x07y"
ESCAPED = "x\\x1b]0;PWNED\\x07y"


def test_printable_escapes_every_control_character_and_keeps_every_letter():
    assert printable(HOSTILE) == ESCAPED
    assert printable("\x1b[2J\x9b31m") == "\\x1b[2J\\x9b31m"  # a CSI, and its one-byte C1 form
    assert printable("evil\u202etxt.py") == "evil\\u202etxt.py"  # a bidi override reorders what follows
    assert printable("a\nb\rc\td\x7f\u200b\ud800") == "a\\nb\\rc\\td\\x7f\\u200b\\ud800"  # a value passes as one line
    letters = "runs/été-中文-Ελληνικά-русский-עברית-العربية-हिन्दी-日本語 x.py"
    assert printable(letters) == letters
    assert printable(3) == "3" and printable(None) == "None"


def test_a_whole_message_keeps_its_own_line_breaks_and_escapes_each_line():
    assert printable(f"first {HOSTILE}\nsecond\r", keep_lines=True) == f"first {ESCAPED}\nsecond\\r"


def _run_dir_of_strangers(tmp_path) -> str:
    """A --run-dir that holds files not a run's: refused before anything starts."""
    folder = tmp_path / HOSTILE
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    return str(folder)


def _two_run_dirs_without_metrics(tmp_path) -> list[str]:
    return [str(tmp_path / HOSTILE), str(tmp_path / f"{HOSTILE}2")]


@pytest.mark.parametrize(("arguments", "status"), [
    pytest.param(lambda tmp: [f"{tmp}/{HOSTILE}.py:workload", "--headless"], EXIT_USAGE, id="workload-path"),
    pytest.param(lambda tmp: ["mlp", "--headless", "--config", f"{tmp}/{HOSTILE}.toml"], EXIT_USAGE, id="config"),
    pytest.param(lambda tmp: ["--resume", f"{tmp}/{HOSTILE}", "--headless"], EXIT_USAGE, id="resume-headless"),
    pytest.param(lambda tmp: ["--resume", f"{tmp}/{HOSTILE}"], EXIT_USAGE, id="resume-app"),
    pytest.param(lambda tmp: ["mlp", "--headless", "--run-dir", _run_dir_of_strangers(tmp)], EXIT_USAGE, id="run-dir"),
    pytest.param(lambda tmp: ["mlp", "--headless", "--steps", "2", f"--{HOSTILE}"], EXIT_USAGE, id="unknown-flag"),
    pytest.param(lambda tmp: ["export", f"{tmp}/{HOSTILE}", "--csv", f"{tmp}/out.csv"], EXIT_USAGE, id="export"),
    pytest.param(lambda tmp: ["compare", *_two_run_dirs_without_metrics(tmp)], EXIT_USAGE, id="compare"),
])
def test_a_refusal_shows_the_users_words_escaped(arguments, status, tmp_path, capsys):
    try:
        assert main(arguments(tmp_path)) == status
    except SystemExit as refused:  # argparse's refusal exits from inside the parser
        assert refused.code == status
    said = capsys.readouterr()
    assert "\x1b" not in said.out + said.err and "\x07" not in said.out + said.err
    assert ESCAPED in said.err


def test_a_headless_runs_lines_show_its_run_directory_escaped(tmp_path, capsys):
    """Rich escapes markup, not control characters: it dropped the BEL and wrote the ESC through."""
    run_dir = tmp_path / HOSTILE / "run"
    assert main(["mlp", "--headless", "--steps", "1", "--run-dir", str(run_dir)]) == EXIT_OK
    said = capsys.readouterr()
    assert "\x1b" not in said.out + said.err and "\x07" not in said.out + said.err
    assert f"Run directory: {printable(run_dir)}\n" in said.err


def test_the_apps_words_from_elsewhere_are_escaped_where_they_are_shown(tmp_path):
    """Textual drops a bell but writes an ESC through to the terminal (found by running an app on a pty): a workload
    file's name, the trainer's error, a notice and a compared run's folder are shown escaped."""
    from torchlab.tui.formatting import short_workload
    from torchlab.tui.run_history import RunHistory
    from torchlab.tui.state import RunState

    state = RunState()
    state.log("error", f"the run failed: {HOSTILE}\nsecond line", toast=HOSTILE)
    [entry] = state.take_log()
    assert (entry.text, entry.toast) == (f"the run failed: {ESCAPED}\nsecond line", ESCAPED)
    assert short_workload(f"/models/{HOSTILE}.py:workload") == f"{ESCAPED}.py:workload"
    assert RunHistory(tmp_path / HOSTILE).name == ESCAPED


async def test_the_error_screen_shows_the_failure_escaped():
    from textual.app import App
    from textual.widgets import Static

    from torchlab.core.wire.run_status import RunStatus
    from torchlab.tui.screens.error_screen import ErrorScreen
    from torchlab.tui.state import Failure

    app = App()
    async with app.run_test() as pilot:
        app.push_screen(ErrorScreen(Failure(RunStatus.FAILED, f"boom {HOSTILE}", f"Traceback\n  {HOSTILE}", 3)))
        await pilot.pause()
        shown = [str(app.screen.query_one(f"#{name}", Static).content) for name in ("error-message", "error-detail")]
    assert shown == [f"boom {ESCAPED}", f"Traceback\n  {ESCAPED}"]
