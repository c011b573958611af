"""PyTorch's memory history: reading the ring whole without the GIL
(`PickledSnapshot`), the pieces kept since the job's first allocation (`History`), when
to look at the ring, and the duty cycle of recording allocation sites (`HistoryDuty`).

Stdlib only; nothing here raises into the job.
"""

import collections
import os
import struct
import sys
import threading
import time

from .settings import (
    ENTRIES_PER_ALLOCATION, HISTORY_MIN_SHARE, HISTORY_PERIOD_S, HISTORY_RATE,
    PICKLED_SNAPSHOT_SYMBOL, RING_CHECK_S, RING_COPY_POLL_S, RING_FLOOR_RATE,
)


def ring_look_period(count, last, now, entries, per_allocation=ENTRIES_PER_ALLOCATION):
    """Seconds to the next look at the ring: RING_CHECK_S, or sooner where a quarter of the
    ring would fill before then at the pace since the last look (`last`: its time and
    allocation count), or at RING_FLOOR_RATE where that pace was slower or is not known
    yet, so that a look always comes while a ring checkpointed from a quarter full is still
    under the 0.8 of it that restart_ring reads whole. 10 ms at the least: a look is one
    stats read (15 us). `per_allocation`: the ring's entries an allocation (TorchAllocator's
    entries_per_allocation)."""
    rate = 0.0
    if count is not None and last is not None and now > last[0] and last[1] is not None:
        rate = per_allocation * max(0, count - last[1]) / (now - last[0])
    return max(0.01, min(RING_CHECK_S, 0.25 * entries / max(rate, RING_FLOOR_RATE)))


class PickledSnapshot:
    """`torch::cuda::_memory_snapshot_pickled()`: the snapshot _snapshot() returns, pickled
    by PyTorch's C++ (protocol 2) instead of built as Python objects. Not bound to Python;
    libtorch_cuda.so exports it, and a ctypes call releases the GIL for its whole length,
    so the job's thread runs on while it converts the ring (the allocator's lock is held
    only while the ring is copied: 3.5 ms for 65,536 entries on the H100).

    It returns a std::string, which the x86-64 System V ABI returns through a hidden
    pointer passed first: `read` passes a buffer for it, copies the bytes out and frees
    them with libc's free (libstdc++'s operator delete). Used only where that is exactly
    so: Linux on x86-64, the cxx11 string ABI, the symbol under its mangled name (which
    fixes the signature: no arguments). VRAMTOP_RING_READ=0 turns it off."""

    def __init__(self, function, free):
        self._function = function
        self._free = free

    @classmethod
    def find(cls, torch):
        """The reader, or (None, why not)."""
        if os.environ.get("VRAMTOP_RING_READ", "1") == "0":
            return None, "VRAMTOP_RING_READ=0"
        import platform

        if not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "AMD64"):
            return None, "reading the ring off the GIL needs Linux on x86-64"
        if getattr(getattr(torch, "_C", None), "_GLIBCXX_USE_CXX11_ABI", None) is not True:
            return None, "this torch is not built with the cxx11 string ABI"
        path = os.path.join(os.path.dirname(getattr(torch, "__file__", "") or ""), "lib", "libtorch_cuda.so")
        if not os.path.exists(path):
            return None, "no libtorch_cuda.so beside torch"
        try:
            import ctypes

            # Already loaded by torch: this only takes a handle on it. Through CDLL a call
            # releases the GIL.
            function = getattr(ctypes.CDLL(path), PICKLED_SNAPSHOT_SYMBOL)
            free = ctypes.CDLL(None).free
        except (OSError, AttributeError):
            return None, "this torch does not export _memory_snapshot_pickled"
        function.argtypes = [ctypes.c_void_p]
        function.restype = ctypes.c_void_p
        free.argtypes = [ctypes.c_void_p]
        free.restype = None
        return cls(function, free), None

    def read(self, before_call=None):
        """The pickled snapshot, as bytes; the job's threads run on meanwhile. `before_call`,
        if given, is called just before the foreign call, with nothing of Python's between
        them (read_then_clear times the call from there)."""
        import ctypes

        # std::string (libstdc++, cxx11): data pointer, size, then 16 bytes of inline buffer.
        out = ctypes.create_string_buffer(32)
        base = ctypes.addressof(out)
        if before_call is not None:
            before_call()
        self._function(base)
        data, size = struct.unpack_from("=QQ", out.raw, 0)
        try:
            return ctypes.string_at(data, size)
        finally:
            if data != base + 16:
                self._free(data)


def cpu_clock_of_this_thread():
    """This thread's CPU clock (for wait_for_the_copy), or None where there is none (not
    Linux). Taken by the thread itself: pthread_getcpuclockid on another thread that may
    have ended is undefined, and can crash the process."""
    try:
        return time.pthread_getcpuclockid(threading.get_ident())
    except (AttributeError, OSError):
        return None


def wait_for_the_copy(reader, at_call, need_s, poll_s=RING_COPY_POLL_S):
    """Returns once the thread `reader`, reading the ring (PickledSnapshot.read), has run
    `need_s` seconds of its own CPU time since it made the call (`at_call()`: its CPU clock
    (cpu_clock_of_this_thread, taken by the reader) and that clock's reading then, or None
    until it has made it), or has ended: by then PyTorch has copied the ring, and a clear
    that comes now cannot come before the copy.

    Its CPU time, not the wall's: a reader that waits for the allocator's lock (the job
    holds it while cudaMalloc or cudaFree runs, for milliseconds near a cap) or for a core
    (a busy host) uses none. Timed by the wall, the clear overtook such a reader: the read
    then held only what followed the clear, and the history began again there (a U-Net under
    a 24 GiB cap with five other jobs on the host, H200: 5 steps of 85 kept). The reader's
    CPU before PyTorch takes the lock (the call itself, PyTorch's clock converter) is a small
    part of `need_s` (RING_COPY_CPU_S). Without a clock it waits for the reader's end."""
    time.sleep(need_s)  # a thread runs no faster than the wall
    while reader.is_alive():
        call = at_call()
        if call is not None and call[0] is not None:
            clock, cpu_then = call
            try:
                if time.clock_gettime(clock) - cpu_then >= need_s:
                    return
            except OSError:
                return  # it has ended: its clock is gone
        time.sleep(poll_s)


def trim_oldest(pieces, over, kind_of, size_of, keep):
    """Drops the oldest of `pieces` (a list or deque, oldest first) until `over` bytes have
    gone or `keep` pieces are left, so that what stays is still a history: it begins at a
    state, or at the job's first events. A state goes with the events after it (they
    begin where it was read); the job's first events go alone. Returns the bytes still
    over (<= 0 when enough went). The one rule for the hook's own limit (`History.pack`)
    and the kept file's (`OomKeeper`)."""
    while over > 0 and len(pieces) > keep:
        cut = 2 if kind_of(pieces[0]) == "state" and len(pieces) > 2 else 1
        for _ in range(cut):
            over -= size_of(pieces[0])
            del pieces[0]
    return over


class History:
    """The job's allocator history in pieces (hook 1.5), for the file kept at an OOM: the
    ring as read just before each checkpoint cleared it (`events`), and the snapshot taken
    just after (`state`), each as PyTorch pickled it, zlib-compressed. In order: [events,
    state, events, state, ...] from the job's first allocation (`from_start`), else [state,
    events, state, ...] from an older checkpoint. The events between a ring's read and its
    clearing are in no piece: vramtop puts in what the next `state` says changed.

    Pieces are added as read (`add`, before the checkpoint ends: an OOM waits for it, and
    then finds the checkpoint and the history before it in step) and compressed after
    (`pack`).
    Past `limit` bytes the oldest pieces go, an events piece with the state before it, so
    the history then begins at a later checkpoint."""

    def __init__(self, limit):
        self.limit = limit
        self.pieces = collections.deque()  # (kind, bytes, compressed)
        self.bytes = 0

    def restart(self, state):
        """The history begins anew at the checkpoint `state` (none before it is whole)."""
        self.clear()
        self._add("state", state)

    def clear(self):
        self.pieces.clear()
        self.bytes = 0

    def add(self, events, state):
        """The ring read before a checkpoint (`events`: every entry since the last one, or
        since the job's start when there were no pieces yet) and the checkpoint `state`."""
        self._add("events", events)
        self._add("state", state)

    def _add(self, kind, data):
        self.pieces.append((kind, data, False))
        self.bytes += len(data)

    def pack(self):
        """Compresses the pieces added since (zlib releases the GIL), then keeps to `limit`.
        Each piece is replaced whole, in one store: an OOM reading them meanwhile sees it
        as read or compressed, never half of each."""
        import zlib

        for i, (kind, data, packed) in enumerate(list(self.pieces)):
            if not packed:
                small = zlib.compress(data, 1)
                self.pieces[i] = (kind, small, True)
                self.bytes += len(small) - len(data)
        # At least one pair stays: a history past the limit begins at a later checkpoint.
        over = trim_oldest(self.pieces, self.bytes - self.limit, lambda p: p[0], lambda p: len(p[1]), keep=2)
        self.bytes = self.limit + over

    def of(self):
        """What an OOM's file carries (`vramtop_oom.history`), or None without pieces."""
        pieces = list(self.pieces)
        if not pieces:
            return None
        return {
            "version": 1,
            "from_start": pieces[0][0] == "events",
            "pieces": [
                {"kind": kind, ("zlib" if packed else "pickle"): data} for kind, data, packed in pieces
            ],
        }


class HistoryDuty:
    """Records allocation stacks for a share of each period (see HISTORY_RATE).

    At each period's start the job's allocation rate over the last period sets the share:
    HISTORY_RATE / rate, at least HISTORY_MIN_SHARE, at most all. The recorded window sits
    at a random place in each period: a job whose step divides the period would otherwise
    be recorded at the same point of its step every time, and a leak made elsewhere in the
    step would never get a site. A leak that allocates every step is still recorded in most
    periods when steps are short, and in every period when the job allocates slowly; what
    is not recorded shows as memory with no site.
    """

    def __init__(self, alloc, offset=None):
        self.alloc = alloc
        # offset(room) -> where in [0, room] this period's window starts. From a generator
        # of our own: drawing from `random`'s shared one would change the job's own random
        # numbers (a seeded training run would no longer repeat).
        import random  # here, not at the top: every Python process of the job imports us

        rng = random.Random()
        self.offset = offset or (lambda room: rng.uniform(0.0, room))
        self.share = 1.0
        self.recording = True
        now = time.monotonic()
        self.period_start = now
        self.window = (now, now + HISTORY_PERIOD_S)  # this period's recorded span
        self.next_switch = now + HISTORY_PERIOD_S
        self.last_count = alloc.allocation_count()
        self.broken = False

    def tick(self, now):
        if now < self.next_switch:  # also when broken: next_switch is then infinite
            return
        period_end = self.period_start + HISTORY_PERIOD_S
        if now < period_end:
            opens, closes = self.window
            if not self.recording and opens <= now < closes:
                self.next_switch = closes
                self.switch(True)
            else:
                self.next_switch = period_end
                if self.recording and now >= closes:
                    self.switch(False)  # the share of this period is over
            return
        count = self.alloc.allocation_count()
        elapsed = max(now - self.period_start, 1e-3)
        if count is not None and self.last_count is not None and count >= self.last_count:
            rate = (count - self.last_count) / elapsed
            self.share = 1.0 if rate <= HISTORY_RATE else max(HISTORY_RATE / rate, HISTORY_MIN_SHARE)
        self.last_count = count
        self.period_start = now
        span = HISTORY_PERIOD_S * self.share
        opens = now if self.share >= 1.0 else now + self.offset(HISTORY_PERIOD_S - span)
        self.window = (opens, opens + span)
        if opens <= now:
            self.next_switch = now + span
            if not self.recording:
                self.switch(True)
        else:
            self.next_switch = opens
            if self.recording:
                self.switch(False)

    def switch(self, on):
        if self.alloc.set_recording(on):
            self.recording = on
            return
        # Stop switching, with no further wake-ups (Hook.timeout reads next_switch), and
        # say truly what is recorded from now on: all if it could not be turned off,
        # nothing if it could not be turned back on.
        self.broken = True
        self.next_switch = float("inf")
        self.share = 0.0 if on else 1.0
