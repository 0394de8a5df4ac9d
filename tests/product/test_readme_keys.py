"""The README and the manual in docs/ name keys, commands and flags that exist, and link pages and sections that
exist. The README's key table (at the top of "The workbench") names every live option's key, read from the options'
registry: `D` (parallel) was found only in a section 800 lines below it (issue 45). When the README's manual moved
into docs/ (issue 48), every page got the same check: a key a page names is bound in the app, a command it gives is
one of torchlab-tui's with flags its parser takes, and a link leads to a page and a heading that are there."""

from __future__ import annotations

import argparse
import importlib
import inspect
import pkgutil
import re
from functools import cache
from pathlib import Path

import pytest

from torchlab.core.options import LIVE_OPTIONS

ROOT = Path(__file__).parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
PAGE_IDS = [str(page.relative_to(ROOT)) for page in PAGES]

#: How the pages write a key that is not a letter, and the name Textual binds it by.
KEY_NAMES = {"?": "question_mark", "/": "slash", "←": "left", "→": "right"}
#: An inline code span that is a key: one letter (or ?, /, an arrow), or a named key (`space`, `ctrl+p`).
KEY_SPAN = re.compile(r"[A-Za-z?/←→]|space|escape|enter|tab|(ctrl|shift|alt)\+\w+")
SUBCOMMAND_MODULES = ("attach", "stop", "serve", "compare", "export", "plan")


def prose(text: str) -> str:
    """The page without its fenced code blocks (a Python comment there is no heading, a letter no key)."""
    return re.sub(r"^```.*?^```[^\n]*$", "", text, flags=re.S | re.M)


def code_spans(text: str) -> list[str]:
    """The page's inline code spans, outside fenced blocks; a span that wraps a line is one span."""
    return [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", prose(text))]


def shell_lines(text: str) -> list[str]:
    """The lines of the page's ```bash blocks, a line continued with a backslash joined to the next, comments cut."""
    lines = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            lines.append(re.sub(r"(^|\s)#.*$", "", line))
    return lines


@cache
def bound_keys() -> frozenset[str]:
    """Every key the app binds: the workbench's table, each screen's and widget's BINDINGS, the command palette's."""
    from textual.app import App
    from textual.binding import Binding

    import torchlab.tui

    keys = {App.COMMAND_PALETTE_BINDING}
    for module_info in pkgutil.walk_packages(torchlab.tui.__path__, "torchlab.tui."):
        module = importlib.import_module(module_info.name)
        for owner in vars(module).values():
            if inspect.isclass(owner) and owner.__module__.startswith("torchlab.tui") and "BINDINGS" in vars(owner):
                for binding in vars(owner)["BINDINGS"]:
                    key = binding.key if isinstance(binding, Binding) else binding[0]
                    keys.update(part.strip() for part in key.split(","))
    from torchlab.tui.app_keys import KEY_ACTIONS

    keys.update(action.key for action in KEY_ACTIONS)
    return frozenset(keys)


def keys_not_bound(text: str) -> list[str]:
    return sorted({span for span in code_spans(text)
                   if KEY_SPAN.fullmatch(span) and KEY_NAMES.get(span, span) not in bound_keys()})


class _Parsed(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


def _parser_of(main, monkeypatch_class: type) -> argparse.ArgumentParser:
    """The parser a command's ``main`` builds, caught as it is about to parse (nothing of the command runs)."""
    def caught(self, *args, **kwargs):
        raise _Parsed(self)

    original = monkeypatch_class.parse_args
    monkeypatch_class.parse_args = caught
    try:
        main(["--help"])
    except _Parsed as parsed:
        return parsed.parser
    finally:
        monkeypatch_class.parse_args = original
    raise AssertionError(f"{main.__module__}.main parsed no arguments")


@cache
def parsers() -> dict[str, argparse.ArgumentParser]:
    """torchlab-tui's parser, each of its commands', the worker's (under torchrun) and torchrun's own."""
    from torch.distributed.run import get_args_parser

    from torchlab.core.launch import worker
    from torchlab.core.launch.arguments import SUBCOMMANDS, CommandParser, build_parser

    assert set(SUBCOMMANDS) == set(SUBCOMMAND_MODULES), "a command was added: name its module here"
    found = {"torchlab-tui": build_parser(), "worker": _parser_of(worker.main, argparse.ArgumentParser),
             "torchrun": get_args_parser()}
    for name in SUBCOMMAND_MODULES:
        found[name] = _parser_of(importlib.import_module(f"torchlab.core.launch.{name}").main, CommandParser)
    return found


def _flag_faults(parser_name: str, words: list[str], flags: set[str] | None = None) -> list[str]:
    """What is wrong with these words as flags of that parser (or of any, given their flags): a flag it does not
    take, a live option `--at`/`--trial` names that is none."""
    flags = set(parsers()[parser_name]._option_string_actions) if flags is None else flags
    faults = []
    for flag, value in zip(words, [*words[1:], ""]):
        if not flag.startswith("--") or flag == "--":
            continue
        if flag.split("=", 1)[0] not in flags:
            faults.append(f"{parser_name} has no {flag}")
        scripted = re.match(r"[^:\s]+:([a-z_]+)=", value)
        if flag in ("--at", "--trial") and scripted and scripted.group(1) not in {o.name for o in LIVE_OPTIONS}:
            faults.append(f"{flag} {value}: no live option {scripted.group(1)}")
    return faults


def _invocation_faults(words: list[str]) -> list[str]:
    """One shell command's words, from the program on: torchlab-tui (a command, or a workload and flags), the
    worker under torchrun (its flags, then torchlab-tui's after ``--``), torchrun's own flags before ``-m``."""
    from torchlab.core.engine.adapters.loading import SAMPLES

    program, args = words[0], words[1:]
    if program == "torchlab.core.launch.cli":  # python -m: torchlab-tui itself
        program = "torchlab-tui"
    if program.endswith("torchrun"):
        module_at = args.index("-m") if "-m" in args else len(args)
        return _flag_faults("torchrun", args[:module_at]) + _invocation_faults(args[module_at + 1:])
    if program == "torchlab.core.launch.worker":
        ends = args.index("--") if "--" in args else len(args)
        return _flag_faults("worker", args[:ends]) + _invocation_faults(["torchlab-tui", *args[ends + 1:]])
    if args[:1] and args[0] in SUBCOMMAND_MODULES:
        return _flag_faults(args[0], args[1:])
    if args[:1] and re.fullmatch(r"[a-z_]+", args[0]) and args[0] not in SAMPLES:
        return [f"no built-in sample {args[0]} (the samples: {', '.join(SAMPLES)})"]
    return _flag_faults("torchlab-tui", args)


def command_faults(text: str) -> list[str]:
    """Every torchlab-tui command the page gives (in its bash blocks and its code spans) and every flag it names in
    a span of its own (`--spike-window`), checked against the parsers."""
    commands = shell_lines(text) + [span for span in code_spans(text) if "torchlab" in span]
    faults = []
    for command in commands:
        for segment in re.split(r"&&|;|\||>", command):
            words = segment.split()
            starts = [i for i, word in enumerate(words)
                      if re.fullmatch(r"(.*/)?(torchlab-tui|torchrun)", word)
                      or (word.startswith("torchlab.core.launch.") and words[i - 1:i] == ["-m"])]
            if starts:
                faults += [f"`{segment.strip()}`: {fault}" for fault in _invocation_faults(words[starts[0]:])]
    every_flag = {flag for parser in parsers().values() for flag in parser._option_string_actions}
    for span in code_spans(text):
        if span.startswith("--"):
            faults += [f"`{span}`: {fault}" for fault in _flag_faults("any command", span.split(), every_flag)]
    return faults


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation and backticks dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {github_anchor(heading) for heading in re.findall(r"^#+ (.+)$", prose(page.read_text()), flags=re.M)}


def link_faults(page: Path) -> list[str]:
    faults = []
    for target in re.findall(r"\]\(([^)\s]+)\)", prose(page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            faults.append(f"{target}: no such file")
        elif anchor and anchor not in anchors(linked):
            faults.append(f"{target}: {linked.name} has no heading #{anchor}")
    return faults


def test_the_key_table_names_every_live_options_key():
    readme = README.read_text()
    workbench = readme.split("## The workbench", 1)[1]
    table = "\n".join(line for line in workbench.splitlines()[:40] if line.startswith("|"))
    keys = set(re.findall(r"\| `([^`]+)` \|", table))
    missing = [f"{option.key} ({option.name})" for option in LIVE_OPTIONS if option.key and option.key not in keys]
    assert not missing, f"the README's key table lacks {missing}"


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_every_key_a_page_names_is_bound_in_the_app(page):
    assert not keys_not_bound(page.read_text()), f"{page.name} names keys the app does not bind"


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_every_command_and_flag_a_page_gives_exists(page):
    faults = command_faults(page.read_text())
    assert not faults, f"{page.name}: " + "; ".join(faults)


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_every_link_of_a_page_leads_to_a_page_and_heading_that_exist(page):
    faults = link_faults(page)
    assert not faults, f"{page.name}: " + "; ".join(faults)


def test_every_docs_page_is_linked_from_the_readme():
    linked = set(re.findall(r"\]\((docs/[^)#\s]+)", README.read_text()))
    orphans = [str(page.relative_to(ROOT)) for page in PAGES[1:] if str(page.relative_to(ROOT)) not in linked]
    assert not orphans, f"the README's 'Where to read more' does not link {orphans}"


def test_the_checks_catch_a_key_a_flag_a_command_and_a_link_that_do_not_exist(tmp_path):
    """Each check fails on what it guards against: a check that passes everything would pass the pages too."""
    assert keys_not_bound("press `Z` to zoom, `ctrl+y` to yank; `q` quits") == ["Z", "ctrl+y"]
    faults = command_faults("`--stpes 5`, `torchlab-tui attach --wiew`, `--at 5:ampp=bf16`\n\n"
                            "```bash\ntorchlab-tui tiny_gtp --headless\n"
                            "torchrun --nprocs 2 -m torchlab.core.launch.worker --run-dir r --sockett s \\\n"
                            "    -- mlp --step 3\n```\n")
    assert [fault.split(": ", 1)[1] for fault in faults] == [
        "no built-in sample tiny_gtp (the samples: mlp, convnet, tiny_gpt)",
        "torchrun has no --nprocs", "worker has no --sockett", "torchlab-tui has no --step",
        "attach has no --wiew", "any command has no --stpes", "--at 5:ampp=bf16: no live option ampp",
    ]
    page = tmp_path / "page.md"
    page.write_text("# A page\n\n[here](#a-page), [there](#nowhere), [gone](gone.md)\n")
    assert link_faults(page) == ["#nowhere: page.md has no heading #nowhere", "gone.md: no such file"]
