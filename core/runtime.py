"""Where a run's socket and token live: a per-user runtime directory only its owner can enter.

Standard library only (the app uses it too). ``$XDG_RUNTIME_DIR/torchlab`` when that is set, else
``/tmp/torchlab-<uid>``. An existing directory is used only if it is a real directory (not a
symlink), owned by this user, with mode 0700; anything else is refused rather than trusted.
"""

from __future__ import annotations

import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path


class RuntimeDirError(OSError):
    """The runtime directory exists but is not safe to use; the message says why."""


def runtime_dir() -> Path:
    base = os.environ.get("XDG_RUNTIME_DIR")
    path = Path(base) / "torchlab" if base else Path(f"/tmp/torchlab-{os.getuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise RuntimeDirError(f"{path} is not a directory (a symlink or file is there); remove it.")
    if info.st_uid != os.getuid():
        raise RuntimeDirError(f"{path} belongs to another user (uid {info.st_uid}); remove it or set XDG_RUNTIME_DIR.")
    if stat.S_IMODE(info.st_mode) != 0o700:
        raise RuntimeDirError(f"{path} has mode {stat.S_IMODE(info.st_mode):o}, not 700: run chmod 700 {path}.")
    return path


@dataclass(frozen=True)
class Endpoint:
    """The socket a trainer serves and the file holding the token a client must present."""

    socket_path: Path
    token_path: Path

    @classmethod
    def create(cls, name: str) -> Endpoint:
        """A fresh endpoint with a new random token in a 0600 file. ``name`` identifies the run."""
        directory = runtime_dir()
        endpoint = cls(directory / f"{name}.sock", directory / f"{name}.token")
        descriptor = os.open(endpoint.token_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(secrets.token_hex(32))
        return endpoint

    def read_token(self) -> str:
        return self.token_path.read_text().strip()

    def remove(self) -> None:
        for path in (self.socket_path, self.token_path):
            try:
                path.unlink()
            except FileNotFoundError:
                pass
