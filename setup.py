"""Package discovery for the one ``torchlab`` namespace spread over three top-level folders.

``pyproject.toml`` holds the metadata. This file exists because setuptools cannot find packages under a
prefix: ``core/`` is installed as ``torchlab.core``, ``tui/`` as ``torchlab.tui`` and ``sample_models/``
as ``torchlab.sample_models``. Every subpackage and every file the app reads at run time (stylesheets and
the like: anything in a package folder that is not Python) is found here by walking the folders, so a
new widget folder or stylesheet cannot be left out of the wheel by a list that fell behind.
"""

from pathlib import Path

from setuptools import find_packages, setup

FOLDERS = {"core": "torchlab.core", "tui": "torchlab.tui", "sample_models": "torchlab.sample_models"}
NOT_PACKAGE_DATA = {".py", ".pyc"}

packages, package_dir, package_data = [], {}, {}
for folder, name in FOLDERS.items():
    package_dir[name] = folder
    for subpackage in ["", *find_packages(folder)]:
        dotted = f"{name}.{subpackage}" if subpackage else name
        packages.append(dotted)
        directory = Path(folder, *subpackage.split(".")) if subpackage else Path(folder)
        data = sorted(p.name for p in directory.iterdir() if p.is_file() and p.suffix not in NOT_PACKAGE_DATA)
        if data:
            package_data[dotted] = data

setup(packages=packages, package_dir=package_dir, package_data=package_data)
