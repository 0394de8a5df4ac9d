"""The README's key table (at the top of "The workbench") names every live option's key, read from the options'
registry: `D` (parallel) was found only in a section 800 lines below it (issue 45)."""

from __future__ import annotations

import re
from pathlib import Path

from torchlab.core.wire.options import LIVE_OPTIONS


def test_the_key_table_names_every_live_options_key():
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    workbench = readme.split("## The workbench", 1)[1]
    table = "\n".join(line for line in workbench.splitlines()[:40] if line.startswith("|"))
    keys = set(re.findall(r"\| `([^`]+)` \|", table))
    missing = [f"{option.key} ({option.name})" for option in LIVE_OPTIONS if option.key and option.key not in keys]
    assert not missing, f"the README's key table lacks {missing}"
