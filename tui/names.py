"""Module names shortened to a column's width, so that each row can still be told from the others.

A name that fits is shown as it is. One that does not is cut in the middle, keeping both ends: the start
names the model's part (``transformer``), the end the layer (``attn.c_attn``), so in 23 characters
``transformer.h.0.attn.c_attn`` reads ``transfo…h.0.attn.c_attn``. Cut from the left only, as before, the
rows of a HuggingFace ResNet's four stages read ``…0.layer.0.convolution`` alike.

A shortened name must name one row: a label ``head…tail`` is kept only if no other name shown starts with
``head`` and ends with ``tail`` (a reader could not tell those apart, even where the two labels differ by
where the cut falls). Where no single cut tells a name from its neighbours (they differ at places far from
both ends: the stage and layer indices in the middle of 52 characters), the label keeps the part that
differs between two cuts, in 30 characters ``res…0.layers.1.layer.0…olution``; where even that is too
wide, a run of each place that differs (``r…0…1…0…olution``), and where those do not fit either, the
preferred cut: the table then gives the names more room (torchlab/tui/widgets/grad_table.py).
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Iterator, Sequence

ELLIPSIS = "…"
#: Labels of one name tried in order before the one built from where its rivals differ: a table of a
#: thousand modules in a narrow column is labelled in well under a second.
MAX_LABELS_TRIED = 150


def shorten_names(names: Sequence[str], width: int) -> list[str]:
    """Each name in at most ``width`` characters, in the same order; names that differ keep labels that do."""
    width = max(width, 4)
    if all(len(name) <= width for name in names):
        return list(names)
    # Every name by each of its starts and ends up to the width: the names a label could stand for are
    # among those that end with its tail (or, with no tail, start with its head), found at once.
    starting: dict[str, list[str]] = defaultdict(list)
    ending: dict[str, list[str]] = defaultdict(list)
    for name in set(names):
        for length in range(1, min(len(name), width) + 1):
            starting[name[:length]].append(name)
            ending[name[len(name) - length:]].append(name)
    return [name if len(name) <= width else _label(name, width, starting, ending) for name in names]


def _preferred_head(name: str, width: int) -> int:
    """How much of its start a name keeps in its preferred cut: its first dotted part when short, else a third."""
    room = width - 1
    first = name.split(".", 1)[0]
    return min(len(first), room // 3) if len(first) < len(name) else room // 3


def _label(name: str, width: int, starting: dict[str, list[str]], ending: dict[str, list[str]]) -> str:
    """The first label of ``name`` in order of preference that no other name shown also fits."""
    preferred = None
    for head, middle, tail in itertools.islice(_labels(name, width), MAX_LABELS_TRIED):
        runs = [head, tail] if middle is None else [head, middle, tail]
        preferred = preferred or runs
        candidates = ending[tail] if tail else starting[head]
        if not any(other != name and _fits(other, runs) for other in candidates):
            return ELLIPSIS.join(runs)
    # The names differ at more places than one window holds (three indices and the last part, in 15
    # characters): keep those places, a run each. Where even they do not fit, the preferred cut.
    # Closest first (the most of both ends in common): the places where they differ are the ones a label needs
    # anyway, and an order of its own makes the labels the same in every process (a set's order is not).
    rivals = sorted((other for other in set(starting[name[:1]]) | set(ending[name[-1:]]) if other != name),
                    key=lambda other: (-_ends_in_common(name, other), other))
    return _runs_label(name, width, rivals) or ELLIPSIS.join(preferred)


def _ends_in_common(name: str, other: str) -> int:
    """How many characters ``name`` and ``other`` share at their start and at their end together."""
    start = next((i for i, (a, b) in enumerate(zip(name, other)) if a != b), min(len(name), len(other)))
    end = next((i for i, (a, b) in enumerate(zip(reversed(name), reversed(other))) if a != b), min(len(name), len(other)))
    return start + end


def _labels(name: str, width: int) -> Iterator[tuple[str, str | None, str]]:
    """``(head, middle, tail)`` labels of ``name`` in ``width`` characters, most readable first: one cut in the
    middle (the start's first part kept whole when short), then the cut moved either way as long as the end
    keeps its last part, then two cuts around a window of whole parts (``bert…0…output.dense``), then around
    any window, then the single cuts that keep less of the end."""
    room = width - 1  # one ellipsis
    preferred = _preferred_head(name, width)
    last_part = len(name) - 1 - name.rfind(".")
    # At least a character of either end: a label that starts or ends with "…" is cut from one side only.
    heads = [preferred, *range(preferred - 1, 0, -1), *range(preferred + 1, room)]
    readable = [head for head in heads if room - head >= min(last_part, room // 2)]
    for head in readable:
        yield name[:head], None, name[len(name) - (room - head):]
    for start, end in _windows(name, width):
        budget = width - 2 - (end - start)
        tail = _whole_parts_at_end(name[end:], min(len(name) - end, math.ceil(budget * 2 / 3), budget - 1))
        head = _whole_parts_at_start(name[:start], min(start, budget - tail))
        yield name[:head], name[start:end], name[len(name) - tail:]
    for head in heads:
        if head not in readable:
            yield name[:head], None, name[len(name) - (room - head):]


def _whole_parts_at_end(text: str, most: int) -> int:
    """How much of the end of ``text`` to keep, at most ``most``: whole dotted parts where some fit."""
    for length in range(most, 0, -1):
        if length < len(text) and text[len(text) - length - 1] == ".":
            return length
    return most


def _whole_parts_at_start(text: str, most: int) -> int:
    """How much of the start of ``text`` to keep, at most ``most``: whole dotted parts where some fit."""
    for length in range(most, 0, -1):
        if length < len(text) and text[length] == ".":
            return length
    return most


def _windows(name: str, width: int) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of middles to keep between two cuts, shortest first: runs of whole dotted parts, then
    any run of characters; each leaves room for at least one character at either end."""
    longest = width - 4
    bounds = [0] + [index + 1 for index, char in enumerate(name) if char == "."]
    ends = [index for index, char in enumerate(name) if char == "."] + [len(name)]
    whole = sorted(
        ((start, end) for start in bounds for end in ends if start < end and end - start <= longest
         and start > 0 and end < len(name)),
        key=lambda window: (window[1] - window[0], window[0]),
    )
    yield from whole
    for length in range(1, longest + 1):
        for start in range(1, len(name) - length):
            yield start, start + length


def _runs_label(name: str, width: int, rivals: list[str]) -> str | None:
    """A label of several runs of ``name`` (``r…0…1…2…lution``): a character wherever a rival that still fits
    it first differs from it, then the last run and the first grown into the room left. None when those
    places do not fit in ``width``."""
    leaf = len(name) - 1 - name.rfind(".")
    shown = {0, *range(len(name) - min(leaf, width // 2), len(name))}
    while True:
        runs = _runs(name, shown)
        if len(ELLIPSIS.join(runs)) > width:
            return None
        rival = next((other for other in rivals if _fits(other, runs)), None)
        if rival is None:
            return _fill(name, width, shown)
        place = next((i for i, (a, b) in enumerate(zip(name, rival)) if a != b), min(len(name), len(rival)) - 1)
        if place in shown:  # aligned at the left they differ where the label shows already: align at the right
            place = len(name) - 1 - next((i for i, (a, b) in enumerate(zip(reversed(name), reversed(rival))) if a != b), 0)
        if place in shown:
            # Shown, yet the rival still fits (a run of "0" found at another 0 of it): the run needs context.
            start = max(i for i in range(place + 1) if i in shown and i - 1 not in shown)
            if start == 0:
                return None
            shown.add(start - 1)
            continue
        shown.update(_short_part_around(name, place))


def _short_part_around(name: str, place: int) -> range:
    """The dotted part of ``name`` holding ``place`` when it is short (an index: ``12``), else ``place`` alone (a
    dot too: "layer.1." against "layer.10." differs at the dot, and the part before it, "1", is shown already;
    left out, the label never changed and ``_runs_label`` looped for ever)."""
    start = name.rfind(".", 0, place) + 1
    end = name.find(".", place)
    end = len(name) if end < 0 else end
    return range(start, end) if end - start <= 3 and start <= place < end else range(place, place + 1)


def _fill(name: str, width: int, shown: set[int]) -> str:
    """The runs of ``shown`` with the last run, then the first, grown into the width left."""
    shown = set(shown)
    for start_from_end in (True, False):
        while True:
            runs = _runs(name, shown)
            if len(ELLIPSIS.join(runs)) >= width:
                break
            missing = [i for i in range(len(name)) if i not in shown]
            if not missing:
                break
            candidate = max(missing) if start_from_end else min(missing)
            grown = _runs(name, shown | {candidate})
            if len(ELLIPSIS.join(grown)) > width:
                break
            shown.add(candidate)
    return ELLIPSIS.join(_runs(name, shown))


def _runs(name: str, shown: set[int]) -> list[str]:
    """The runs of consecutive shown positions of ``name``, in order."""
    runs: list[str] = []
    previous = None
    for index in sorted(shown):
        if previous is not None and index == previous + 1:
            runs[-1] += name[index]
        else:
            runs.append(name[index])
        previous = index
    return runs


def _fits(other: str, runs: list[str]) -> bool:
    """Whether ``other`` could be the name behind a label of these runs: it starts with the first, ends with the
    last, and holds the others in order in between."""
    head, *middle, tail = runs
    if len(other) < len(head) + len(tail) or not other.startswith(head) or not other.endswith(tail):
        return False
    position, end = len(head), len(other) - len(tail)
    for run in middle:
        found = other.find(run, position, end)
        if found < 0:
            return False
        position = found + len(run)
    return True


def describe_blocks(blocks: Sequence[str]) -> str:
    """The blocks activation checkpointing wraps, in a few words: ``bert.encoder.layer.0–3 (4 blocks)`` for
    consecutive items of one list, else their names (the first three, and how many more)."""
    if not blocks:
        return "no blocks (this model has none to wrap)"
    count = f"{len(blocks)} block{'s' if len(blocks) != 1 else ''}"
    prefixes = {block.rpartition(".")[0] for block in blocks}
    indices = [block.rpartition(".")[2] for block in blocks]
    if len(blocks) > 1 and len(prefixes) == 1 and all(index.isdigit() for index in indices):
        numbers = [int(index) for index in indices]
        if numbers == list(range(numbers[0], numbers[0] + len(numbers))):
            return f"{prefixes.pop()}.{numbers[0]}–{numbers[-1]} ({count})"
    shown = ", ".join(blocks[:3])
    return f"{shown} and {len(blocks) - 3} more ({count})" if len(blocks) > 3 else shown
