"""Helpers for the hook's tests: a job under the hook (a real subprocess with the real
bootstrap on PYTHONPATH, against the stub torch) and a viewer speaking protocol v1."""

import atexit
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import unittest

# Every folder the tests make (tempfile.mkdtemp: socket directories, kept OOMs, user
# sitecustomize folders) goes under one private root, removed when the run ends, so a run
# leaves nothing in /tmp whichever test fails.
_ROOT = tempfile.mkdtemp(prefix="vramtop-hook-tests-")
tempfile.tempdir = _ROOT
atexit.register(shutil.rmtree, _ROOT, True)

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
HOOK_DIR = os.path.join(REPO, "python", "vramtop", "_hook")
STUB_DIR = os.path.join(HERE, "stub_torch")
DRIVER = os.path.join(HERE, "job_driver.py")


def hook_env(socket_dir, extra_path=(), **extra):
    env = dict(os.environ)
    for key in ("VRAMTOP_HOOK", "VRAMTOP_HISTORY", "STUB_TORCH_LACKS", "PYTORCH_CUDA_ALLOC_CONF",
                "RANK", "LOCAL_RANK", "WORLD_SIZE"):
        env.pop(key, None)
    env["PYTHONPATH"] = os.pathsep.join([HOOK_DIR, STUB_DIR] + list(extra_path))
    env["VRAMTOP_SOCKET_DIR"] = socket_dir
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def wait_for(predicate, timeout=10.0, step=0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    return predicate()


class Job:
    """job_driver.py run under the hook; `do` sends one command and returns its reply."""

    def __init__(self, socket_dir=None, **env):
        self.dir = socket_dir or tempfile.mkdtemp(prefix="vth-")
        os.chmod(self.dir, 0o700)
        self.proc = subprocess.Popen(
            [sys.executable, DRIVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=hook_env(self.dir, **env),
            text=True,
        )
        self.socket_path = os.path.join(self.dir, "vramtop-%d.sock" % self.proc.pid)

    def do(self, command):
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline().strip()
        if not reply.startswith("ok"):
            raise AssertionError("job said %r to %r (its stderr follows at exit)" % (reply, command))
        return reply

    def wait_socket(self, timeout=10.0):
        if not wait_for(lambda: os.path.exists(self.socket_path), timeout):
            raise AssertionError("no socket at %s" % self.socket_path)

    def finish(self, timeout=10.0):
        """Close stdin (the driver then ends normally); return (rc, stdout, stderr)."""
        if not self.proc.stdin.closed:
            self.proc.stdin.close()
        out = self.proc.stdout.read()
        err = self.proc.stderr.read()
        return self.proc.wait(timeout), out, err

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                stream.close()
            except (OSError, ValueError):
                pass


class Viewer:
    """A protocol v1 viewer, strict about framing, with a timeout on every read."""

    opened = []  # closed by the tests' tearDown

    def __init__(self, path, timeout=5.0):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        Viewer.opened.append(self.sock)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.buffer = b""

    def send(self, message):
        body = json.dumps(message).encode()
        self.sock.sendall(struct.pack(">I", len(body)) + body)

    def send_raw(self, data):
        self.sock.sendall(data)

    def subscribe(self, interval_s):
        self.send({"type": "subscribe", "interval_s": interval_s})

    def _read_exactly(self, n):
        while len(self.buffer) < n:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise EOFError("the hook closed the connection")
            self.buffer += chunk
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def recv(self):
        (length,) = struct.unpack(">I", self._read_exactly(4))
        assert length <= 16 * 1024 * 1024, "frame of %d bytes" % length
        message = json.loads(self._read_exactly(length).decode("utf-8"))
        assert isinstance(message, dict) and isinstance(message.get("type"), str)
        return message

    def recv_type(self, kind, limit=200):
        for _ in range(limit):
            message = self.recv()
            if message["type"] == kind:
                return message
        raise AssertionError("no %s in %d messages" % (kind, limit))

    def ready_hello(self):
        """Read hellos until one says CUDA is ready (the hook then has its OOM observer)."""
        for _ in range(5):
            hello = self.recv_type("hello")
            if hello["cuda_ready"]:
                return hello
        raise AssertionError("no hello with cuda_ready")

    @classmethod
    def close_all(cls):
        while cls.opened:
            cls.opened.pop().close()

    def closed_by_peer(self, timeout=5.0):
        """True when the hook has closed this connection (after draining what it sent)."""
        self.sock.settimeout(timeout)
        try:
            while True:
                if not self.sock.recv(1 << 20):
                    return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except socket.timeout:
            return False

    def close(self):
        self.sock.close()


class KeptFilesTest(unittest.TestCase):
    """The OOM keeper in this process: files go to a fresh folder (`VRAMTOP_OOM_DIR`, made by
    the keeper itself), and `OOM_MAX_MB`, which tests lower, is put back afterwards."""

    def setUp(self):
        if HOOK_DIR not in sys.path:
            sys.path.insert(0, HOOK_DIR)
        import vramtop_hook

        self.hook = vramtop_hook
        self.dir = tempfile.mkdtemp(prefix="vth-keep-")
        self.saved = (os.environ.get("VRAMTOP_OOM_DIR"), vramtop_hook.oom.OOM_MAX_MB)
        os.environ["VRAMTOP_OOM_DIR"] = os.path.join(self.dir, "made-here")

    def tearDown(self):
        directory, cap = self.saved
        if directory is None:
            os.environ.pop("VRAMTOP_OOM_DIR", None)
        else:
            os.environ["VRAMTOP_OOM_DIR"] = directory
        self.hook.oom.OOM_MAX_MB = cap
        shutil.rmtree(self.dir, ignore_errors=True)
