"""The hook's server: one daemon thread that waits for torch and CUDA, listens on
`vramtop-<pid>.sock` and sends each subscribed viewer a state at its interval.

Stdlib only; nothing here raises into the job.
"""

import atexit
import os
import selectors
import socket
import sys
import threading
import time

from .history import HistoryDuty, ring_look_period
from .oom import flush_kept, install_excepthooks, on_oom, watch_untracked_ooms
from .settings import (
    FORGIVE_S, HOOK_VERSION, INTERVAL_RANGE, MAX_VIEWERS, MAX_VIEWER_FRAME, POLL_S,
    PROTOCOL_VERSION, RING_ENTRIES, STALL_S, env_int, say_once,
)
from .sockets import UNKNOWN_PEER, peer_uid, private_dir, socket_dir, viewer_allowed
from .torch_allocator import TorchAllocator
from .wire import FrameReader, ProtocolError, encode, encode_fitting


class Viewer:
    """One connected viewer: what it asked for and the frame still owed to it."""

    def __init__(self, sock, now):
        self.sock = sock
        self.reader = FrameReader(MAX_VIEWER_FRAME)
        self.interval = None  # None until it subscribes
        self.next_due = now
        self.pending = b""  # the rest of the one frame already begun
        self.owed = []  # (kind, frame): kept messages waiting behind `pending`, one per kind
        self.refused_since = None  # first refused write since it last took bytes
        self.events = selectors.EVENT_READ  # what the selector watches it for


def started_by_multiprocessing(argv=None):
    """True in a child that multiprocessing started as a fresh interpreter: spawn's (and the
    forkserver's) run `python -c "from multiprocessing.spawn import spawn_main; ..."
    --multiprocessing-fork`. sys.orig_argv (3.10+) keeps the -c code; sys.argv keeps the flag."""
    if argv is None:
        argv = list(getattr(sys, "orig_argv", None) or []) + list(sys.argv)
    return "--multiprocessing-fork" in argv or any(
        "multiprocessing.spawn" in a or "multiprocessing.forkserver" in a for a in argv)


class Hook:
    """The server of one process. A forked child gets a fresh one (see _after_fork)."""

    def __init__(self, history, forked):
        self.pid = os.getpid()
        self.history_wanted = history
        self.forked = forked
        self.lock = threading.Lock()  # viewers and their write state
        self.viewers = []
        self.selector = None
        self.listener = None
        self.path = None
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        self.stopping = False
        self.thread = None
        self.torch = None
        self.alloc = None  # TorchAllocator once torch is imported
        self.cuda_ready = False
        self.seq = 0
        self.next_collect = 0.0
        self.last_cpu_cost = 0.0  # seconds of CPU the previous read took
        self.forgiven_until = 0.0  # no slow read is forgiven before this (monotonic)
        self.duty = None  # HistoryDuty once history is on
        self.kept = {}  # "oom"/"error"/"untracked_oom" -> frame replayed to later viewers
        self.untracked_ooms = 0  # OOMs seen under a backend that tracks no blocks
        self.uncaught = False
        self.prepare_lock = threading.Lock()
        self.prepared = False
        self.next_ring_check = 0.0
        self.last_ring_look = None  # (time, allocation_count()) at the last look
        self.segments_wanted = False  # a viewer subscribed and has no map yet

    # ----- the thread -------------------------------------------------------------------

    def run(self):
        try:
            if self.alloc is None:  # started by hand: torch may not be imported yet
                if not self.wait_for_torch():
                    return
                self.meet_torch(self.torch)
            install_excepthooks()
            # A forked child (a DataLoader worker) serves only if it uses CUDA itself. Look
            # only after the other at-fork handlers (torch's marks CUDA unusable) have run.
            # So does a child multiprocessing started fresh (a DataLoader's workers under
            # spawn, mp.spawn's ranks): one that never uses CUDA is no job of its own.
            if self.forked or started_by_multiprocessing():
                time.sleep(POLL_S)
                if not self.wait(self.alloc.cuda_initialised):
                    return
            if not self.listen():
                return
            self.serve()
        except Exception as err:  # the hook dies quietly; the job goes on
            say_once("crash", "stopped serving after an internal error: %r" % (err,))

    def wait(self, ready):
        while not self.stopping:
            if ready():
                return True
            time.sleep(POLL_S)
        return False

    def wait_for_torch(self):
        """True once torch is fully imported (a notebook may start us before it imports)."""
        while not self.stopping:
            module = sys.modules.get("torch")
            spec = getattr(module, "__spec__", None)
            if module is not None and not getattr(spec, "_initializing", False):
                if hasattr(module, "cuda"):
                    self.torch = module
                    return True
            time.sleep(POLL_S)
        return False

    def meet_torch(self, torch):
        self.torch = torch
        self.alloc = TorchAllocator(torch)
        self.arm_cuda_init()

    def listen(self):
        directory = private_dir(socket_dir())
        if directory is None:
            return False
        path = os.path.join(directory, "vramtop-%d.sock" % self.pid)
        if len(path.encode()) > 100:
            say_once("path", "socket path %s is too long for a Unix socket" % path)
            return False
        # Bound under a name viewers do not look for (shorter than `path`; vramtop clears
        # one a dead job left), and renamed once listening: a viewer that finds `path` can
        # connect (between bind and listen it would be refused).
        unready = os.path.join(directory, ".vt-%d.new" % self.pid)
        listener = None
        try:
            for stale in (path, unready):
                if os.path.lexists(stale):
                    os.unlink(stale)  # left by an earlier process with our pid
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(unready)
            os.chmod(unready, 0o600)
            listener.listen(8)
            listener.setblocking(False)
            os.rename(unready, path)
        except OSError as err:
            if listener is not None:
                listener.close()
                try:
                    os.unlink(unready)
                except OSError:
                    pass
            say_once("listen", "cannot listen on %s (%s)" % (path, err))
            return False
        self.listener, self.path = listener, path
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ, "accept")
        self.selector.register(self.wake_r, selectors.EVENT_READ, "wake")
        atexit.register(self.at_exit)
        return True

    def serve(self):
        while not self.stopping:
            try:
                self.serve_once()
            except Exception as err:  # keep serving; never spin on a repeating fault
                say_once("serve", "internal error (serving on): %r" % (err,))
                time.sleep(POLL_S)

    def serve_once(self):
        now = time.monotonic()
        if not self.cuda_ready and self.alloc.cuda_initialised():
            self.on_cuda_ready()
        if self.duty is not None:
            self.duty.tick(now)
        self.watch_ring(now)
        self.sample_series(now)
        self.send_due_states(now)
        with self.lock:
            self.drop_stalled(now)
            self.watch_writes()
        timeout = self.timeout(time.monotonic())
        for key, mask in self.selector.select(timeout):
            self.on_event(key, mask)

    def watch_ring(self, now):
        """Checkpoint the event ring before it can fill, viewer or not (RING_ENTRIES)."""
        alloc = self.alloc
        if not self.cuda_ready or alloc is None or not alloc.ring_entries or now < self.next_ring_check:
            return
        count = alloc.allocation_count()
        self.next_ring_check = now + ring_look_period(count, self.last_ring_look, now, alloc.ring_entries,
                                                      alloc.entries_per_allocation)
        self.last_ring_look = (now, count)
        if alloc.ring_may_be_full():
            alloc.restart_ring(self.recording_stacks())

    def sample_series(self, now):
        alloc = self.alloc
        if self.cuda_ready and alloc is not None and alloc.series.due(now):
            alloc.sample_allocated()

    def recording_stacks(self):
        return self.duty.recording if self.duty is not None else bool(self.alloc and self.alloc.history_on)

    def timeout(self, now):
        if not self.cuda_ready:
            return POLL_S
        due = [v.next_due for v in self.viewers if v.interval is not None]
        limit = 1.0 if any(v.pending or v.owed for v in self.viewers) else 5.0
        if due:
            limit = min(limit, max(min(due), self.next_collect) - now)
        if self.duty is not None:
            limit = min(limit, self.duty.next_switch - now)
        if self.alloc is not None and self.alloc.ring_entries:
            limit = min(limit, self.next_ring_check - now)
        if self.alloc is not None:
            limit = min(limit, self.alloc.series.next_due - now)
        return max(0.0, limit)

    def on_event(self, key, mask):
        if key.data == "accept":
            self.accept()
        elif key.data == "wake":
            try:
                while os.read(self.wake_r, 512):
                    pass
            except OSError:
                pass
        else:
            viewer = key.data
            with self.lock:
                if mask & selectors.EVENT_WRITE:
                    self.flush(viewer)
                if mask & selectors.EVENT_READ and viewer in self.viewers:
                    self.read(viewer)

    def wake(self):
        try:
            os.write(self.wake_w, b"x")
        except OSError:
            pass

    # ----- viewers -----------------------------------------------------------------------

    def accept(self):
        try:
            sock, _ = self.listener.accept()
        except OSError:
            return
        uid = peer_uid(sock)
        if not viewer_allowed(uid):
            # The socket (0600) and its directory (0700) already keep other users out;
            # this holds even where someone opened them up. Nothing is sent: no hello.
            try:
                sock.close()
            except OSError:
                pass
            who = "whose uid could not be read" if uid == UNKNOWN_PEER else "of uid %d" % uid
            say_once("peer", "refused a viewer %s (only uid %d and root may attach)" % (who, os.geteuid()))
            return
        if len(self.viewers) >= MAX_VIEWERS:
            sock.close()
            return
        sock.setblocking(False)
        viewer = Viewer(sock, time.monotonic())
        with self.lock:
            self.viewers.append(viewer)
            self.selector.register(sock, selectors.EVENT_READ, viewer)
            self.offer(viewer, encode(self.hello()))
            for kind in ("oom", "untracked_oom", "error"):
                if kind in self.kept:
                    self.offer(viewer, self.kept[kind], keep=kind)

    def read(self, viewer):
        try:
            data = viewer.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.drop(viewer)
            return
        try:
            messages = viewer.reader.feed(data)
        except ProtocolError:
            self.drop(viewer)
            return
        for message in messages:
            if message["type"] == "subscribe":
                interval = message.get("interval_s")
                if isinstance(interval, (int, float)) and not isinstance(interval, bool):
                    if interval == interval:  # NaN is not a pace
                        low, high = INTERVAL_RANGE
                        viewer.interval = min(max(float(interval), low), high)
                        viewer.next_due = time.monotonic()
                        # Its first state has segments, whatever the ring costs to read
                        # once (the pacing after it accounts for it): it has no map yet.
                        self.segments_wanted = True
            # other types are ignored (forward compatibility)

    def offer(self, viewer, frame, keep=None):
        """Write `frame` whole now, else drop it. A `keep` frame (a kind: "oom", "bye"...)
        waits instead, replacing an older one of its kind, so at most one per kind waits."""
        if viewer.pending:
            if keep:
                self.owe(viewer, keep, frame)
            else:
                self.refused(viewer)
            return
        sent = self.send_some(viewer, frame)
        if sent is None:
            return
        if sent == 0:
            if keep:
                self.owe(viewer, keep, frame)
            self.refused(viewer)
        elif sent < len(frame):
            viewer.pending = memoryview(frame)[sent:]

    def owe(self, viewer, kind, frame):
        viewer.owed = [(k, f) for k, f in viewer.owed if k != kind] + [(kind, frame)]

    def send_some(self, viewer, data):
        try:
            sent = viewer.sock.send(data)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError:
            self.drop(viewer)
            return None
        if sent:
            viewer.refused_since = None
        return sent

    def refused(self, viewer):
        if viewer.refused_since is None:
            viewer.refused_since = time.monotonic()

    def flush(self, viewer):
        """Finish the begun frame, then the kept ones, as far as the socket takes them."""
        while viewer in self.viewers:
            if not viewer.pending:
                if not viewer.owed:
                    return
                viewer.pending = memoryview(viewer.owed.pop(0)[1])
            sent = self.send_some(viewer, viewer.pending)
            if not sent:
                if sent == 0:
                    self.refused(viewer)
                return
            viewer.pending = viewer.pending[sent:]

    def drop_stalled(self, now):
        for viewer in list(self.viewers):
            if viewer.refused_since is not None and now - viewer.refused_since > STALL_S:
                self.drop(viewer)

    def watch_writes(self):
        """Ask to hear of writability only from viewers we owe bytes to."""
        for viewer in self.viewers:
            events = selectors.EVENT_READ
            if viewer.pending or viewer.owed:
                events |= selectors.EVENT_WRITE
            if events == viewer.events:
                continue
            try:
                self.selector.modify(viewer.sock, events, viewer)
                viewer.events = events
            except (KeyError, ValueError, OSError):
                pass

    def drop(self, viewer):
        if viewer in self.viewers:
            self.viewers.remove(viewer)
        try:
            self.selector.unregister(viewer.sock)
        except (KeyError, ValueError, OSError):
            pass
        try:
            viewer.sock.close()
        except OSError:
            pass

    def broadcast(self, frame, keep):
        with self.lock:
            for viewer in list(self.viewers):
                self.offer(viewer, frame, keep=keep)
        self.wake()

    def keep_and_tell(self, kind, frame):
        """Keep `frame` as the latest of `kind` (an OOM, an error: what a viewer that comes
        later is sent first) and send it to the viewers now, under one lock: a viewer
        accepted between the two would otherwise get it twice, kept and told."""
        with self.lock:
            self.kept[kind] = frame
            listening = self.listener is not None
            if listening:
                for viewer in list(self.viewers):
                    self.offer(viewer, frame, keep=kind)
        if listening:
            self.wake()

    # ----- messages ----------------------------------------------------------------------

    def hello(self):
        alloc = self.alloc
        return {
            "type": "hello",
            "protocol": PROTOCOL_VERSION,
            "pid": self.pid,
            "ppid": os.getppid(),
            "argv": [str(a)[:1024] for a in getattr(sys, "argv", [])[:64]],
            "hook_version": HOOK_VERSION,
            "torch_version": str(getattr(self.torch, "__version__", None) or "") or None,
            "cuda_ready": self.cuda_ready,
            "history": bool(alloc and alloc.history_on),
            "ring": alloc.ring_entries if alloc else 0,
            "allocator_backend": alloc.backend if alloc else None,
            "capabilities": list(alloc.capabilities) if alloc else [],
            "missing": list(alloc.missing) if alloc else [],
            "rank": env_int("RANK"),
            "local_rank": env_int("LOCAL_RANK"),
            "world_size": env_int("WORLD_SIZE"),
        }

    def arm_cuda_init(self):
        """Ask torch to call us the moment the job initialises CUDA.

        torch.cuda._lazy_init runs the callables queued by torch.cuda._lazy_call right after
        torch._C._cuda_init(), in the job's thread, before the job's first CUDA call goes
        on. Without this, the OOM observer and history would start only at our next poll,
        and a job that fills memory at once could OOM unseen. A queued call that raises
        breaks the job's CUDA init (DeferredCudaCallError), so ours never raises.
        """
        lazy_call = getattr(getattr(self.torch, "cuda", None), "_lazy_call", None)
        if lazy_call is None:
            return
        try:
            lazy_call(self.on_cuda_init)
        except Exception:
            pass

    def on_cuda_init(self):
        try:
            self.prepare_allocator()
            self.wake()
        except Exception:
            pass

    def prepare_allocator(self):
        """Attach the OOM observer and start history, once, as soon as CUDA is up."""
        with self.prepare_lock:
            if self.prepared:
                return
            self.prepared = True
            if self.alloc.read_backend():
                # cudaMallocAsync or a pluggable one refuses the observer and the ring: its
                # OOMs are seen as PyTorch makes their exceptions instead.
                watch_untracked_ooms(self)
                return
            self.alloc.attach_oom_observer(on_oom)
            self.alloc.start_ring(RING_ENTRIES)
            if self.history_wanted:
                # Stacks are read on our thread later: what reading them imports comes in
                # now, on the job's thread (its CUDA init), or history waits (see
                # TorchAllocator.symbolizer_ready).
                if threading.current_thread() is not self.thread:
                    self.alloc.import_symbolizer()
                if not self.alloc.symbolizer_ready():
                    say_once("history-symbolizer", "history is off: torch._inductor, which PyTorch imports to read recorded stacks, could not be imported on the job's thread")
                    return
                self.alloc.start_history()
                if self.alloc.history_on:
                    self.duty = HistoryDuty(self.alloc)

    def on_cuda_ready(self):
        self.cuda_ready = True
        self.prepare_allocator()
        self.alloc.probe_settings()
        # Under a backend that tracks no blocks the viewer and `vramtop run`'s block say
        # why there is no more; the job's own output gets nothing of ours.
        if self.alloc.missing and not self.alloc.blocks_untracked():
            say_once("missing", "; ".join(self.alloc.missing))
        # Viewers that came before CUDA learn it is ready from a fresh hello.
        self.broadcast(encode(self.hello()), keep="hello")

    def send_due_states(self, now):
        with self.lock:
            due = [
                v for v in self.viewers if v.interval is not None and now >= v.next_due
            ]
        if not due or not self.cuda_ready or now < self.next_collect:
            return
        frame = self.state_frame()
        with self.lock:
            for viewer in due:
                viewer.next_due = now + viewer.interval
                if viewer in self.viewers and frame is not None:
                    self.offer(viewer, frame)

    def state_frame(self):
        started = time.monotonic()
        cpu_started = time.thread_time()
        try:
            alloc = self.alloc
            raw, with_segments = None, True
            if alloc.ring_entries and not alloc.ring_cheap_to_read() and not self.segments_wanted:
                # Reading the ring now would cost more than the state is worth: a checkpoint
                # if it is due (its snapshot is cheap), else the stats alone.
                if alloc.ring_may_be_full() and alloc.restart_ring(self.recording_stacks()):
                    raw = alloc.checkpoint_raw()
                with_segments = raw is not None or not alloc.ring_entries
            state = alloc.collect(raw=raw, segments=with_segments)
            if with_segments:
                self.segments_wanted = False
        except Exception as err:
            say_once("collect", "reading the allocator failed: %r" % (err,))
            state = None
        cost = time.monotonic() - started
        if self.alloc.ring_entries and self.alloc.ring_fill >= self.alloc.ring_entries:
            self.alloc.restart_ring(self.recording_stacks())
        frame = None
        if state is not None:
            self.seq += 1
            message = {"type": "state", "seq": self.seq, "time_s": time.time()}
            message.update(state)
            message["collect_ms"] = round(cost * 1000.0, 3)
            if self.duty is not None:
                message["history_share"] = round(self.duty.share, 3)
            frame = encode_fitting(message)
        # Pace ourselves so a state costs the job at most 1 % of its time whatever the
        # viewers ask, on our thread's CPU time for the whole state: reading the allocator
        # and encoding the frame (both hold the GIL; on the H100 the encoding added half
        # as much again as the read, so pacing on the read alone let the hook take 1.6 %
        # at 0.1 s). Waiting for the GIL costs the job nothing.
        # One slow read is forgiven, once per FORGIVE_S: with history, PyTorch's snapshot
        # once spent 4.9 s of CPU symbolising (on the H100, 2.11, GIL released; the reads
        # before and after took 0.4 ms), and pacing on it stopped all states for minutes.
        # Reads that are slow again and again are paced on what they cost.
        cpu_cost = time.thread_time() - cpu_started
        pace = cpu_cost
        if cpu_cost > 10 * self.last_cpu_cost and started >= self.forgiven_until:
            # Paced as the read before it (a first read: as a 5 ms one), which a viewer
            # that attaches late to a long job needs: its first read is the slow one.
            relief = max(self.last_cpu_cost, 0.005)
            if cpu_cost > relief:
                pace = relief
                self.forgiven_until = started + FORGIVE_S
        self.next_collect = started + pace / 0.01
        self.last_cpu_cost = cpu_cost
        return frame

    # ----- the end -----------------------------------------------------------------------

    def at_exit(self):
        if os.getpid() != self.pid:
            return  # a forked child exiting through atexit: the socket is the parent's
        flush_kept()  # a burst's newest OOM, kept and told before the bye
        self.stopping = True
        self.wake()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(1.0)
        code = 1 if self.uncaught else None
        bye = encode({"type": "bye", "time_s": time.time(), "exit_code": code})
        with self.lock:
            for viewer in list(self.viewers):
                self.offer(viewer, bye, keep="bye")
            self.drain(deadline=time.monotonic() + 0.5)
            for viewer in list(self.viewers):
                self.drop(viewer)
        self.close_listener(unlink=True)

    def drain(self, deadline):
        """At exit only: give slow viewers up to `deadline` to take what they are owed."""
        while time.monotonic() < deadline:
            waiting = [v for v in self.viewers if v.pending or v.owed]
            if not waiting:
                return
            for viewer in waiting:
                self.flush(viewer)
            time.sleep(0.01)

    def close_listener(self, unlink):
        if self.listener is not None:
            try:
                self.listener.close()
            except OSError:
                pass
        if unlink and self.path is not None:
            try:
                os.unlink(self.path)
            except OSError:
                pass

    def abandon(self):
        """In a forked child: let go of the parent's sockets without touching them."""
        self.stopping = True
        for viewer in list(self.viewers):
            try:
                viewer.sock.close()  # our copy only; never shutdown(): the parent's too
            except OSError:
                pass
        self.close_listener(unlink=False)
        for fd in (self.wake_r, self.wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        if self.selector is not None:
            try:
                self.selector.close()
            except Exception:
                pass
