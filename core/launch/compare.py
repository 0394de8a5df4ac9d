"""``torchlab-tui compare RUN_A RUN_B [...]``: runs compared on one screen (tui/screens/compare_screen.py), from
their files: their curves against step or training time, the settings that differ, their option changes.

Standard library and the app only: no torch in this process.
"""

from __future__ import annotations

import sys
from pathlib import Path

from textual.app import App

from torchlab.core.errors import EXIT_OK, EXIT_USAGE, TorchlabError, printable
from torchlab.core.launch.arguments import command_parser
from torchlab.core.launch.terminal import require_terminal
from torchlab.tui.run_history import RunHistory
from torchlab.tui.screens.compare_screen import CompareScreen


class CompareApp(App[int]):
    """The compare screen alone; leaving it (esc, q) ends the command."""

    TITLE = "torchlab compare"

    def __init__(self, runs: list[RunHistory]) -> None:
        super().__init__()
        self.runs = runs

    def on_mount(self) -> None:
        self.push_screen(CompareScreen(self.runs), callback=lambda _: self.exit(EXIT_OK))


def main(argv: list[str]) -> int:
    parser = command_parser("compare")
    parser.add_argument("runs", type=Path, nargs="+", metavar="RUN", help="run directories (runs/<time>-<workload>)")
    args = parser.parse_args(argv)
    try:
        args.runs = _each_once(args.runs)
        if len(args.runs) < 2:
            raise TorchlabError("give two runs or more to compare: torchlab-tui compare RUN_A RUN_B")
        runs = [RunHistory.load(path) for path in args.runs]
        require_terminal("torchlab-tui compare", "`torchlab-tui export RUN --csv FILE` writes a run's figures for "
                                                 "other tools.")
    except TorchlabError as error:
        print(f"torchlab-tui compare: {printable(error, keep_lines=True)}", file=sys.stderr)
        return EXIT_USAGE
    return CompareApp(runs).run() or EXIT_OK


def _each_once(paths: list[Path]) -> list[Path]:
    """The runs named, each once in the order first named: a glob and a name for the same run (``runs/*mlp
    runs/20261129-042714-mlp``) drew it twice, with the same colour twice in the legend."""
    seen: set[Path] = set()
    once = []
    for path in paths:
        key = path.resolve()
        if key not in seen:
            seen.add(key)
            once.append(path)
    return once

