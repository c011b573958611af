"""vramtop's hook inside a PyTorch job: serves the CUDA caching allocator's live state to
vramtop viewers over a Unix socket (protocol v1, crates/vramtop-attach/PROTOCOL.md).

Entered through sitecustomize.py (beside this package) when the job imports torch, or by
hand: `import vramtop_hook; vramtop_hook.start()` (a notebook). One daemon thread waits
for torch and for CUDA to be initialised by the job (it never initialises CUDA itself),
listens on `vramtop-<pid>.sock`, and sends each subscribed viewer a `state` at its
interval.

The package, split at its seams; each module imports only those before it in this list:
  settings         limits, VRAMTOP_* knobs, say_once (the one voice on the job's stderr)
  wire             the protocol's frames
  sockets          the socket directory and the viewer's uid
  processes        other processes on the GPU (NVML, /proc)
  history          PyTorch's ring read whole off the GIL, its pieces, the sites' duty
  roles            what the memory is for (optimizers, models), the allocated series
  torch_allocator  the torch adapter: the caching allocator as the protocol wants it
  running          the hook running in this process
  oom              every OOM told, kept on disk, and reported if uncaught
  server           the hook's thread: viewers, states, the OOM observer
This module keeps the process-wide entry points and the fork handler.

Rules every module keeps: never raise into the job (every entry point is wrapped); never
block the job on a viewer (non-blocking sockets; a frame that cannot go out is dropped,
only the remainder of a frame already begun is kept); say once on stderr what it could
not do. Python 3.8+, stdlib only. Optional torch APIs are found by feature (hasattr), not
version.
"""

import os
import threading
import time

from . import oom, running
from .server import Hook
from .settings import HOOK_VERSION, say_once
from .sockets import socket_dir  # the package `vramtop` (any version) calls it from here

__all__ = ["HOOK_VERSION", "start", "mark_step", "torch_imported", "socket_dir"]

_start_lock = threading.Lock()


def start(history=None):
    """Start serving this process (idempotent). Safe to call from a notebook cell.

    history: record allocation sites (default: VRAMTOP_HISTORY=1). The hook waits on its
    own thread for torch and CUDA; calling this never imports torch or initialises CUDA.
    """
    try:
        with _start_lock:
            if running.hook is not None and running.hook.pid == os.getpid():
                return
            running.hook = Hook(_history_wanted(history), forked=False)
            _launch(running.hook)
    except Exception as err:
        say_once("start", "could not start: %r" % (err,))


def mark_step():
    """The end of one of the job's steps, as the job says it (`vramtop.step()`): marked as
    an optimizer step is. Never raises into the job."""
    try:
        hook = running.hook
        if hook is not None and hook.alloc is not None:
            hook.alloc.steps.append(time.time())
    except Exception:
        pass


def torch_imported(torch):
    """The bootstrap's entry: called in the importing thread as `import torch` finishes, so
    the CUDA-init callback is queued before the job's next line can initialise CUDA."""
    try:
        with _start_lock:
            if running.hook is not None and running.hook.pid == os.getpid():
                return
            hook = Hook(_history_wanted(None), forked=False)
            hook.meet_torch(torch)
            running.hook = hook
            _launch(hook)
    except Exception as err:
        say_once("start", "could not start: %r" % (err,))


def _history_wanted(history):
    if history is None:
        return os.environ.get("VRAMTOP_HISTORY", "").strip() == "1"
    return bool(history)


def _launch(hook):
    thread = threading.Thread(target=hook.run, name="vramtop-hook", daemon=True)
    hook.thread = thread
    thread.start()


def _after_fork_in_child():
    global _start_lock
    try:
        _start_lock = threading.Lock()  # the parent's may have been held at fork
        oom.after_fork_in_child()
        parent = running.hook
        if parent is None:
            return
        parent.abandon()
        running.hook = Hook(parent.history_wanted, forked=True)
        _launch(running.hook)
    except Exception:
        running.hook = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
