"""The socket directory and who may connect: a private directory per user, and the
viewer's uid read from the socket (SO_PEERCRED) where the platform tells it.

Stdlib only; nothing here raises into the job.
"""

import os
import socket
import stat
import struct

from .settings import say_once


def socket_dir():
    """Where sockets live (PROTOCOL.md "Where")."""
    explicit = os.environ.get("VRAMTOP_SOCKET_DIR")
    if explicit:
        return explicit
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return os.path.join(runtime, "vramtop")
    return "/tmp/vramtop-%d" % os.getuid()


def private_dir(path):
    """Create `path` 0700 if needed; None (and one line) if it is not ours alone."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        info = os.lstat(path)
    except OSError as err:
        say_once("dir", "cannot use %s (%s); no live view for this job" % (path, err))
        return None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        say_once("dir", "%s is not a directory owned by you; no live view" % path)
        return None
    if info.st_mode & 0o077:
        say_once(
            "dir",
            "%s can be read or written by others (mode %o); no live view. "
            "Run: chmod 700 %s" % (path, info.st_mode & 0o777, path),
        )
        return None
    return path


# What peer_uid returns where it cannot tell: refused (see viewer_allowed).
UNKNOWN_PEER = -1


def peer_uid(sock):
    """The uid of the process at the other end of a Unix socket (SO_PEERCRED, Linux); None
    where the system has no SO_PEERCRED (macOS: then the socket's and its directory's
    modes are the only gate), UNKNOWN_PEER where it has one but it failed."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None
    try:
        # struct ucred: pid_t (signed), uid_t and gid_t (unsigned).
        size = struct.calcsize("iII")
        _pid, uid, _gid = struct.unpack("iII", sock.getsockopt(socket.SOL_SOCKET, option, size))
    except (OSError, struct.error):
        return UNKNOWN_PEER
    return uid


def viewer_allowed(uid):
    """A viewer may connect when it runs as the job's own user or as root (who can read
    any file anyway). Without SO_PEERCRED (None) the file modes decide; where the check
    failed (UNKNOWN_PEER) the viewer is refused."""
    return uid is None or uid == 0 or uid in (os.getuid(), os.geteuid())
