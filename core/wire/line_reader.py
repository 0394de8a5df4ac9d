"""Newline-terminated lines from a socket, each at most a protocol's cap: the one reader of the app's
socket (core/wire/control_server.py) and of the rank channel (core/engine/ranks/channel.py).

Standard library and the protocol's error only: the app's side imports it without torch.
"""

from __future__ import annotations

import socket
import time

from torchlab.core.wire.protocol import ProtocolError


class LineReader:
    """Reads lines of at most ``limit`` bytes from ``connection``; ``received`` counts the bytes.

    A line over the limit raises ProtocolError once; the next call skips the rest of it and reads on, so
    the peer is refused and the connection goes on. The peer's hang-up is EOFError; socket errors (a
    timeout too) propagate as OSError."""

    def __init__(self, connection: socket.socket, limit: int) -> None:
        self._connection = connection
        self._limit = limit
        self._buffer = bytearray()
        self._skipping = False  # in the middle of an over-long line
        self.received = 0

    def next_line(self, deadline: float | None = None) -> bytes:
        """The next line; by ``deadline`` (``time.monotonic()``), if given, or TimeoutError: a peer that sends
        a byte now and then must not hold its connection past it."""
        while True:
            newline = self._buffer.find(b"\n")
            if newline >= 0:
                line = bytes(self._buffer[:newline])
                del self._buffer[: newline + 1]
                if self._skipping:  # the end of an over-long line, already refused
                    self._skipping = False
                    continue
                if len(line) > self._limit:  # the whole of an over-long line came in one read
                    raise ProtocolError(f"message exceeds the limit of {self._limit} bytes")
                return line
            if self._skipping:
                self._buffer.clear()
            elif len(self._buffer) > self._limit:
                self._skipping = True
                self._buffer.clear()
                raise ProtocolError(f"message exceeds the limit of {self._limit} bytes")
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError("timed out")
                self._connection.settimeout(remaining)
            chunk = self._connection.recv(65536)
            if not chunk:
                raise EOFError("connection closed")
            self.received += len(chunk)
            self._buffer += chunk
