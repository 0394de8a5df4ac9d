"""How a message of the protocol travels: one line of JSON, and back. The base of every message (``Message``: its
registry by type, its line, its record in the run's journal), the version both sides speak, the longest line, and
``decode``, which reads a line back into its message or says why it cannot.

Standard library only: the app imports this without torch. One message is one line of UTF-8 JSON,
``{"v": 5, "type": "<name>", ...fields}``, at most ``MAX_LINE_BYTES``. Nothing is ever unpickled.
``decode`` turns a line into a message object or raises ``ProtocolError`` with a reason fit to send
back (text that is not Unicode, half of a surrogate pair escaped alone, is such a line: every string of a
decoded message can be encoded and compared); a peer that receives garbage answers with a ``Refused`` event
and goes on (or closes only that connection), never crashes. The payloads nested in a message (core/wire/payloads.py)
are read field by field too: a reason names the path of what is wrong,
``telemetry.sample.gpus[0].memory_used_bytes: expected int or null, got str``. Each field is declared once, as its
annotation: core/wire/typed_json.py reads a JSON value as the type the annotation names.

Apart from the messages themselves (core/wire/protocol.py), which are the protocol's vocabulary: this is how any of
them is written and read, the same for every message and for the rank channel's own protocol
(core/engine/ranks/channel_messages.py), which is built on ``Message`` with a registry of its own. ``decode`` knows the
messages whose modules have been imported; core/wire/protocol.py imports them all and re-exports what is here, so the
app's protocol is imported from there.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from torchlab.core.errors import SHOWN_CHARS, shown
from torchlab.core.wire import strict_json
from torchlab.core.wire.typed_json import JsonObject, UnreadableValue, read_object, read_value

PROTOCOL_VERSION = 22  #: what each version added: docs/protocol-versions.md (a change to a message bumps it)
MAX_LINE_BYTES = 1 << 20


class ProtocolError(ValueError):
    """A line that is not a valid message; the text says why."""


class OtherVersion(ProtocolError):
    """A line of another version of the protocol (``version``, what its ``v`` says): its peer is a torchlab-tui of
    another release, a run started before an upgrade, which a client of this one can neither read nor command."""

    def __init__(self, version: Any) -> None:
        super().__init__(f"protocol version {shown(version)} is not supported; this side speaks version {PROTOCOL_VERSION}")
        self.version = version

    def sentence(self, name: str, what: str) -> str:
        """``name`` (a run) cannot be ``what`` (attached, stopped) from this release, and what can."""
        return (f"{name} was started by another version of torchlab-tui (it speaks protocol {shown(self.version)}, this "
                f"one {PROTOCOL_VERSION}): it cannot be {what} from this one; use the torchlab-tui that started it, or "
                f"stop its trainer with SIGTERM (kill PID), which ends it at its next step with a checkpoint.")


@dataclass(frozen=True)
class Message(JsonObject):
    """Base of every message; subclasses set ``type`` and declare their fields (each once, its annotation)."""

    type: ClassVar[str] = ""
    #: this protocol's messages by type. A subclass that declares its own registry is the base of another
    #: protocol (the rank channel's, core/engine/ranks/channel_messages.py), whose lines ``decode`` reads apart from these.
    registry: ClassVar[dict[str, type[Message]]] = {}
    #: the longest line this protocol reads
    max_line_bytes: ClassVar[int] = MAX_LINE_BYTES
    #: the event's name in the run's journal, where it differs from ``type``
    journal_name: ClassVar[str] = ""
    #: whether the run's journal (``events.jsonl``) keeps it: False for news that is not history
    journalled: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.type:
            if cls.type in cls.registry:
                raise TypeError(f"two messages are named {cls.type!r}")
            cls.registry[cls.type] = cls

    def encode(self) -> bytes:
        """One line: the message as JSON, NaN/Inf as null, ending in a newline."""
        return (self.json_text() + "\n").encode("utf-8")

    def json_text(self) -> str:
        """The message as JSON text, without the newline: how a command travels inside another message
        (rank 0's broadcast to its ranks, a supervisor's command to rank 0), read back by ``decode``."""
        payload = {"v": PROTOCOL_VERSION, "type": self.type}
        payload.update({f.name: getattr(self, f.name) for f in fields(self)})
        return strict_json.dumps(payload)

    def validate(self) -> None:
        """Checks across fields, after each field's type was checked; raise ProtocolError."""

    @classmethod
    def journal_event(cls) -> str:
        """The ``event`` of this message's lines in ``events.jsonl``: its ``journal_name``, else its type. Readers of the
        journal name an event by this, never by a string of their own."""
        return cls.journal_name or cls.type

    def journal_record(self) -> dict[str, Any]:
        """The event as its line in ``events.jsonl``: ``event``, ``step``, the time it is written, its fields."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        step = values.pop("step", getattr(self, "step", None))
        return {"event": self.journal_event(), "step": step, "time": time.time(), **values}


def fault(error: BaseException) -> str:
    """A fault of ours that one peer's line met, as the refusal that ends it says it: its kind and message, cut
    short (a message may repeat what the peer sent). Each socket answers such a fault with this, and goes on."""
    text = f"{type(error).__name__}: {error}".encode("utf-8", "backslashreplace").decode("utf-8")  # no half surrogate
    return text if len(text) <= 2 * SHOWN_CHARS else text[: 2 * SHOWN_CHARS - 3] + "..."


def decode(line: bytes | bytearray | str, protocol: type[Message] = Message) -> Message:
    """Parse one line into a message of ``protocol`` (the app's by default), validating version, type and
    every field."""
    if isinstance(line, (bytes, bytearray)):
        if len(line) > protocol.max_line_bytes:
            raise ProtocolError(f"message of {len(line)} bytes exceeds the limit of {protocol.max_line_bytes}")
        try:
            line = line.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError("message is not UTF-8") from None
    try:
        payload = json.loads(line)
    except (ValueError, RecursionError):  # ValueError: bad JSON, or an integer over Python's 4300-digit limit
        raise ProtocolError("message is not valid JSON (or holds a number too long to read, or nests too deep)") from None
    _require_unicode(line, payload)
    if not isinstance(payload, dict):
        raise ProtocolError("message must be a JSON object")
    version = payload.pop("v", None)
    if version != PROTOCOL_VERSION:
        raise OtherVersion(version)
    kind = payload.pop("type", None)
    cls = protocol.registry.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ProtocolError(f"unknown message type {shown(kind)}")
    try:
        message = read_object(cls, payload, kind, nested=False)
    except UnreadableValue as error:
        raise ProtocolError(str(error)) from None
    message.validate()
    return message


def read_payload(kind: Any, data: Any, path: str) -> Any:
    """A JSON value read as ``kind`` (a payload type of ``core/wire/payloads.py``, or ``list[`` one ``]``),
    validated field by field as ``decode`` reads one nested in a message; a ProtocolError names the ``path``
    of what is wrong."""
    try:
        return read_value(kind, data, path)
    except UnreadableValue as error:
        raise ProtocolError(str(error)) from None


#: A JSON escape of half of a surrogate pair: the only way a decoded line can hold text that is not Unicode.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _require_unicode(line: str, payload: Any) -> None:
    """ProtocolError if a string of ``payload`` (a name or a value, however deep) holds half of a surrogate pair.

    JSON may escape one half alone (``"\\ud800"``), and ``json.loads`` takes it: the str it makes fails only when
    it is encoded, far from the socket (the token's comparison killed an accept thread). Both halves in order are
    one character (strict_json escapes an emoji so), which the check lets through. Only a line with such an escape
    is checked, by encoding what it decoded to: the common line costs one regex scan."""
    if _SURROGATE_ESCAPE.search(line) is None:
        return
    try:
        json.dumps(payload, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ProtocolError("message holds text that is not Unicode (half of a surrogate pair, escaped alone)") from None
    except RecursionError:  # json.loads read this depth; its encoder may give up a little sooner
        raise ProtocolError("message is not valid JSON (or holds a number too long to read, or nests too deep)") from None
