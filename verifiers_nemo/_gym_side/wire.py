"""Messages between verifiers_nemo's processes and its warm Gym parents: JSON objects and file descriptors
over a Unix stream socket.

A message is a 4-byte big-endian length and that many bytes of JSON. File descriptors travel as
``SCM_RIGHTS`` with the first message sent in each direction of a connection (a request's descriptors, a
reply's pidfd) and are handed to the first message read after them. Standard library only: the Gym
interpreter runs this file, and verifiers_nemo imports it too.
"""

from __future__ import annotations

import array
import json
import os
import socket
import struct
from typing import Any

MAX_FDS = 250
"""The most descriptors one message carries (the kernel's limit for one ``SCM_RIGHTS`` is 253)."""
_HEAD = struct.Struct("!I")
_CHUNK = 1 << 16


class Channel:
    """One end of a connection: ``send`` a message (with descriptors), ``recv`` the next one."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buffer = b""
        self._fds: list[int] = []

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, message: dict[str, Any], fds: list[int] | tuple[int, ...] = ()) -> None:
        data = json.dumps(message, separators=(",", ":")).encode()
        payload = _HEAD.pack(len(data)) + data
        sent = 0
        if fds:
            if len(fds) > MAX_FDS:
                raise ValueError(f"{len(fds)} file descriptors: at most {MAX_FDS} travel in one message")
            rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
            sent = self.sock.sendmsg([payload[:_CHUNK]], rights)
        if sent < len(payload):  # not once more when all went: ``sendall(b"")`` fails (EPIPE) once the peer has
            self.sock.sendall(payload[sent:])  # read the message and closed (a warm parent that answered it)

    def recv(self) -> tuple[dict[str, Any] | None, list[int]]:
        """The next message and the descriptors that came with it; ``(None, [])`` at a clean end of stream.
        ``EOFError`` when the stream ends inside a message."""
        while True:
            if len(self._buffer) >= _HEAD.size:
                (size,) = _HEAD.unpack_from(self._buffer)
                if len(self._buffer) >= _HEAD.size + size:
                    body = self._buffer[_HEAD.size : _HEAD.size + size]
                    self._buffer = self._buffer[_HEAD.size + size :]
                    fds, self._fds = self._fds, []
                    return json.loads(body), fds
            if not self._read():
                if self._buffer:
                    raise EOFError("the connection closed inside a message")
                fds, self._fds = self._fds, []
                for fd in fds:
                    os.close(fd)
                return None, []

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds = []
        self.sock.close()

    def _read(self) -> bool:
        space = socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)
        data, ancillary, _flags, _addr = self.sock.recvmsg(_CHUNK, space, socket.MSG_CMSG_CLOEXEC)
        for level, kind, raw in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(raw[: len(raw) - len(raw) % fds.itemsize])
                self._fds.extend(fds)
        self._buffer += data
        return bool(data)


def peer(sock: socket.socket) -> tuple[int, int, int]:
    """``(pid, uid, gid)`` of the process at the other end of a connected Unix socket (``SO_PEERCRED``)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", creds)
    return pid, uid, gid
