"""The wire protocol (protocol v1, crates/vramtop-attach/PROTOCOL.md): length-prefixed
JSON frames, their reader, and the fitting of an OOM message under the frame limit.

Stdlib only. What raises here (a frame over the limit, a peer breaking framing) is caught
by the server, which drops that frame or that viewer: it never reaches the job.
"""

import json
import struct

from .settings import MAX_FRAME


class ProtocolError(Exception):
    """The peer broke framing; the connection is dropped."""


def encode(message):
    """One frame: 4-byte big-endian length, then compact UTF-8 JSON."""
    body = json.dumps(message, separators=(",", ":"), allow_nan=False).encode("utf-8")
    if len(body) > MAX_FRAME:
        raise ValueError("frame of %d bytes is over the 16 MiB limit" % len(body))
    return struct.pack(">I", len(body)) + body


class FrameReader:
    """Splits a byte stream into JSON objects; any framing fault raises ProtocolError."""

    def __init__(self, limit=MAX_FRAME):
        self.limit = limit
        self.buffer = bytearray()

    def feed(self, data):
        self.buffer += data
        messages = []
        while len(self.buffer) >= 4:
            (length,) = struct.unpack(">I", bytes(self.buffer[:4]))
            if length > self.limit:
                raise ProtocolError("frame of %d bytes is over the limit" % length)
            if len(self.buffer) < 4 + length:
                break
            body = bytes(self.buffer[4 : 4 + length])
            del self.buffer[: 4 + length]
            try:
                message = json.loads(body.decode("utf-8"))
            except (UnicodeDecodeError, ValueError) as err:
                raise ProtocolError("bad frame: %s" % err)
            if not isinstance(message, dict) or not isinstance(message.get("type"), str):
                raise ProtocolError("a frame is not an object with a string type")
            messages.append(message)
        return messages


def encode_fitting(message):
    """Encode, dropping trailing segments (and saying so) until the frame fits 16 MiB."""
    while True:
        try:
            return encode(message)
        except ValueError:
            segments = message.get("segments") or []
            if not segments:
                return None
            message["segments"] = segments[: len(segments) * 3 // 4]
            message["truncated"] = True
