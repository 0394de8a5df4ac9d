#!/usr/bin/env bash
# Fetch, on a machine with a network, the wheels a GPU machine without one lacks, into .whl/ (ignored):
# benchmarks/gpu_pass.sh installs them there with --no-index.
#
#     bash benchmarks/gpu_wheels.sh            # then carry .whl/ to the GPU machine beside the checkout
#
# What is fetched: the app's and the tests' packages that a CUDA image with torch, pytest, rich, psutil,
# nvidia-ml-py, hypothesis and Lightning typically lacks, each at the version this checkout's own venv has
# (the versions its CI passes with), for CPython 3.12 on x86-64 Linux. The GPU machine's own torch stays:
# the pass is about its CUDA build. PYTHON_VERSION=3.11 (say) fetches for another interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."

venv_python=.venv/bin/python
if [[ ! -x $venv_python ]]; then
    echo "gpu_wheels.sh: no .venv here: the versions to fetch are read from it; make it as README.md says" >&2
    exit 2
fi

# The app (textual and what it needs), `serve`, the test plugins, and import-linter for the layer test.
# pytest itself goes too: syrupy 4.8 (the snapshot tests') needs pytest < 9, which the image may not have.
names=(
    textual platformdirs mdit-py-plugins markdown-it-py mdurl rich pygments
    typing_extensions
    textual-serve aiohttp-jinja2
    pytest pluggy iniconfig pytest-asyncio pytest-timeout syrupy pytest-textual-snapshot
    import-linter grimp
)
pins=$("$venv_python" - "${names[@]}" <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version

for name in sys.argv[1:]:
    try:
        print(f"{name}=={version(name)}")
    except PackageNotFoundError:
        sys.exit(f"gpu_wheels.sh: {name} is not in .venv: install the dev extra first (pip install -e '.[dev]')")
EOF
)

rm -rf .whl
mkdir -p .whl
# shellcheck disable=SC2086  # one pin per word
python3 -m pip download --quiet --no-deps --only-binary=:all: \
    --python-version "${PYTHON_VERSION:-3.12}" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl $pins 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
echo "gpu_wheels.sh: $(ls .whl | wc -l) wheels in .whl/ ($(du -sh .whl | cut -f1)):"
ls .whl
