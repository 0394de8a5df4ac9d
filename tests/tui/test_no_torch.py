"""The app's process stays free of torch: a fresh interpreter imports the app and checks sys.modules."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_importing_the_app_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "import torchlab.tui.app, torchlab.tui.state, torchlab.tui.thinning\n"
        "loaded = sorted(name for name in sys.modules if name == 'torch' or name.startswith('torch.'))\n"
        "print(','.join(loaded))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert result.stdout.strip() == ""


def test_the_import_linter_contract_holds() -> None:
    lint = shutil.which("lint-imports", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if lint is None:
        pytest.skip("import-linter is not installed (pip install -e '.[dev]')")
    result = subprocess.run([lint], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
