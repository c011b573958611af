"""Every OOM of a hooked job: told to viewers, kept on disk whole (`OomKeeper`, viewer
or not), and uncaught OOMs reported before the job ends.

Stdlib only; nothing here raises into the job.
"""

import os
import sys
import threading
import time

from . import running
from .history import trim_oldest
from .processes import who_holds_the_gpu
from .settings import env_float, env_int
from .sockets import socket_dir
from .torch_allocator import format_size
from .wire import encode, encode_fitting


# Every OOM of a hooked job is kept on disk, viewer or not (`OomKeeper`).
OOM_FIRST_KEPT = 3
# Largest file kept, in MiB: history is what grows (a full ring is hundreds of MiB), and
# the default folder may be a small tmpfs ($XDG_RUNTIME_DIR). A file without history is
# tens of KiB (72 KiB for a capped checkerboard of 720 blocks, on an H100).
OOM_MAX_MB = env_float("VRAMTOP_OOM_MAX_MB", 64.0)
# A burst: OOMs past the first OOM_FIRST_KEPT, each within OOM_BURST_S of the one before (a
# batch-size search, cuDNN trying workspaces, a job that catches an OOM every step). Each
# rewrote the "last" file on the job's thread: 40 to 48 ms an OOM with a 26 MB history on
# an H200 (PyTorch's own OOM, caught, took 0.06 ms), so 30 caught OOMs cost the job 1.2 to
# 1.4 s (scripts/gpu/jobs/oom_burst.py; 12 ms an OOM with the writer). In a burst the job's thread only reads the state; a
# writer thread keeps the newest, at most once an OOM_BURST_S, and the job's exit (an
# uncaught exception, atexit) waits for it up to OOM_FLUSH_S. An OOM on its own is kept
# before the exception unwinds, as ever: a job killed right after it loses nothing.
OOM_BURST_S = 1.0
OOM_FLUSH_S = 10.0


class OomKeeper:
    """Keeps the allocator's state at an OOM as a PyTorch memory snapshot (the dict
    torch.cuda.memory._snapshot() returns, pickled), so PyTorch's own tools read it as well
    as `vramtop snapshot`. Bounded: the first OOM_FIRST_KEPT OOMs of a process, then the
    latest one in one file rewritten in place; a file over VRAMTOP_OOM_MAX_MB (default 64)
    loses the allocation history first (its `oom` entries stay), and is not written if
    still over.

    Where: VRAMTOP_OOM_DIR (`vramtop run` sets it beside its log), else the hook's socket
    directory. VRAMTOP_OOM_TAG (set by `vramtop run`) names the run in the file name, so it
    finds its job's files; VRAMTOP_OOM_QUIET=1 leaves the saying to `vramtop run`. Writing
    never raises into the job: a full disk or a read-only directory is one line on stderr.

    Added to PyTorch's dict: `vramtop_oom` (the request and the device's figures, which the
    snapshot alone lacks), and, when the allocation history holds no `oom` entry for this
    OOM (history off), one `oom` entry as PyTorch writes them, marked `vramtop_added`.
    """

    def __init__(self):
        self.count = 0
        self.said = set()
        # Two threads can run out of memory at once; each keeps its own file whole. Held
        # while a file is written (the job's thread waits on it only outside a burst).
        self.lock = threading.Lock()
        # The burst's state (`take`, the writer thread, `flush`); never held while writing.
        self.cond = threading.Condition(threading.Lock())
        self.last_oom_at = None
        self.pending = None  # (raw, oom, n, then): the newest OOM of a burst, not yet kept
        self.writing = False
        self.flushing = False  # a flush under way: the writer does not wait
        self.ended = False  # the job is ending: every OOM from now on is kept at once
        self.writer = None
        self.last_written = 0  # the number of the newest OOM kept in the "last" file
        # Viewers are told OOMs in order: an older one told late is dropped (`told`).
        self.tell_lock = threading.Lock()
        self.last_told = 0

    def directory(self):
        return os.environ.get("VRAMTOP_OOM_DIR") or socket_dir()

    def path_for(self, n):
        return self.path_of("%s.pickle" % (str(n) if n <= OOM_FIRST_KEPT else "last"))

    def path_of(self, rest):
        """`vramtop-oom-[TAG-]PID-REST` in the OOM folder: every file this process keeps
        is named so (oom_files.rs finds a run's files, and their pid, by it)."""
        tag = os.environ.get("VRAMTOP_OOM_TAG", "")
        name = "vramtop-oom-%s%d-%s" % (tag + "-" if tag else "", os.getpid(), rest)
        return os.path.join(self.directory(), name)

    def take(self, raw, oom, then):
        """At an OOM, on the job's thread: keep it now and call `then(path)`, or, in a burst
        (OOM_BURST_S), leave both to the writer thread, which keeps only the newest OOM.
        Never raises."""
        try:
            now = time.monotonic()
            with self.cond:
                burst = (self.count >= OOM_FIRST_KEPT and self.last_oom_at is not None
                         and now - self.last_oom_at < OOM_BURST_S and not self.ended)
                self.last_oom_at = now
                self.count += 1
                n = self.count
                if burst and self.start_writer():
                    self.pending = (raw, oom, n, then)  # a newer OOM replaces an unkept one
                    self.cond.notify_all()
                    return
            self.told(n, then, self.keep(raw, oom, n))
        except Exception as err:
            self.say_once("error", "could not keep the allocator state at an OOM: %r; the job goes on" % (err,))

    def start_writer(self):
        """The burst's writer thread, started at the first burst (under `cond`); False where
        it cannot start (the OOM is then kept at once). Its last write is waited for when
        the job ends, also in a multiprocessing worker, which leaves through os._exit
        without atexit but through threading's own shutdown."""
        if self.writer is not None:
            return True
        try:
            writer = threading.Thread(target=self.write_bursts, name="vramtop-oom-writer", daemon=True)
            writer.start()
        except Exception:
            return False
        self.writer = writer
        register_threading_exit()
        return True

    def told(self, n, then, path):
        """`then(path)` for OOM `n`, unless a newer OOM was told already."""
        with self.tell_lock:
            if n < self.last_told:
                return
            self.last_told = n
            then(path)

    def superseded(self, n):
        """Whether a newer OOM is in the "last" file already (OOM `n` is then not kept)."""
        return n > OOM_FIRST_KEPT and n < self.last_written

    def write_bursts(self):
        """The writer thread: keeps the newest pending OOM, then waits OOM_BURST_S (a flush
        cuts the wait) so that an endless burst costs the job one write a second."""
        while True:
            with self.cond:
                while self.pending is None:
                    self.cond.wait()
                raw, oom, n, then = self.pending
                self.pending = None
                self.writing = True
            try:
                # An OOM kept at once after the burst (over a second later) may be newer:
                # this one is then neither kept nor told (the viewer keeps the newest).
                path = self.keep(raw, oom, n)
                if path is not None or not self.superseded(n):
                    self.told(n, then, path)
            except Exception:
                pass
            with self.cond:
                self.writing = False
                self.cond.notify_all()
                self.cond.wait_for(lambda: self.flushing, timeout=OOM_BURST_S)

    def flush(self, ending=True, timeout_s=OOM_FLUSH_S):
        """The burst's newest OOM kept and told, waiting up to `timeout_s`: before the job
        ends (`ending`: every OOM from then on is kept at once), or before a thread's
        uncaught exception is reported. Never raises, not even for Ctrl-C in the wait."""
        if self.writer is None or threading.current_thread() is self.writer:
            with self.cond:
                self.ended = self.ended or ending
            return
        try:
            deadline = time.monotonic() + timeout_s
            with self.cond:
                self.ended = self.ended or ending
                self.flushing = True
                self.cond.notify_all()
                try:
                    while self.pending is not None or self.writing:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            return
                        self.cond.wait(left)
                finally:
                    self.flushing = False
        except BaseException:
            pass

    def keep(self, raw, oom, n=None):
        """Write the snapshot `raw` with the OOM `oom` (the hook's message) as the job's OOM
        number `n` (the next one by default); the path or None. Never raises: whatever goes
        wrong is one line, said once."""
        try:
            if n is None:
                with self.cond:
                    self.count += 1
                    n = self.count
            with self.lock:
                if self.superseded(n):
                    return None
                return self._keep(raw, oom, n)
        except Exception as err:
            self.say_once("error", "could not keep the allocator state at an OOM: %r; the job goes on" % (err,))
            return None

    def _keep(self, raw, oom, n):
        import pickle

        snapshot = self.annotated(raw, oom, n)
        limit = int(OOM_MAX_MB * 1024 * 1024)
        data = pickle.dumps(snapshot, protocol=4)
        history = snapshot["vramtop_oom"].get("history")
        if len(data) > limit and history:
            # The oldest history goes first, an events piece with the state before it;
            # counted by the pieces' own sizes and pickled once more, not at each cut.
            pieces = history["pieces"]
            over = trim_oldest(
                pieces,
                len(data) - limit,
                lambda p: p["kind"],
                lambda p: len(p.get("zlib") or p.get("pickle") or b""),
                keep=1,
            )
            history["from_start"] = pieces[0]["kind"] == "events"
            if over > 0:
                snapshot["vramtop_oom"]["history"] = None
            data = pickle.dumps(snapshot, protocol=4)
        if len(data) > limit and snapshot.get("device_traces"):
            # The history is what grows: keep the state and the trace's own `oom` entries
            # (PyTorch's, or ours), say what was left out.
            snapshot["device_traces"] = [
                [e for e in t if isinstance(e, dict) and e.get("action") == "oom"] for t in snapshot["device_traces"]
            ]
            snapshot["vramtop_oom"]["history_left_out"] = True
            if snapshot["vramtop_oom"].get("ring"):
                snapshot["vramtop_oom"]["ring"] = dict(snapshot["vramtop_oom"]["ring"], complete=False)
            snapshot["vramtop_oom"]["checkpoint"] = None  # nothing to replay from it now
            snapshot["vramtop_oom"]["history"] = None
            data = pickle.dumps(snapshot, protocol=4)
        if len(data) > limit:
            self.say_once("cap", "OOM %d: the allocator state is %d MiB, over VRAMTOP_OOM_MAX_MB (%g); not kept" % (n, len(data) >> 20, OOM_MAX_MB))
            return None
        path = self.path_for(n)
        partial = "%s.%d.part" % (path, threading.get_ident())
        try:
            # Private, as the socket folder it may be: made here first, it must not be 0755.
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            with open(partial, "wb") as f:
                f.write(data)
            os.replace(partial, path)
        except OSError as err:
            try:
                os.unlink(partial)  # a full disk keeps no half-written file
            except OSError:
                pass
            self.say_once("write", "could not keep the allocator state at an OOM in %s: %s; the job goes on" % (self.directory(), err.strerror or err))
            return None
        first_rewrite = n > OOM_FIRST_KEPT and self.last_written == 0
        if n > OOM_FIRST_KEPT:
            self.last_written = n
        if (n <= OOM_FIRST_KEPT or first_rewrite) and os.environ.get("VRAMTOP_OOM_QUIET") != "1":
            later = "; later OOMs rewrite it" if n > OOM_FIRST_KEPT else ""
            self.say("OOM %d: allocator state kept in %s (%s)%s; open it with: vramtop snapshot %s" % (n, path, format_size(len(data)), later, path))
        return path

    @staticmethod
    def annotated(raw, oom, n):
        snapshot = dict(raw)
        device = oom["device"]
        snapshot["vramtop_oom"] = {
            "number": n,
            "pid": os.getpid(),
            "argv": list(sys.argv),
            "time_s": oom["time_s"],
            "device": device,
            "requested_bytes": oom["requested_bytes"],
            "device_free_bytes": oom["device_free_bytes"],
            "device_total_bytes": oom["device_total_bytes"],
            "stats": oom["stats"],
            "summary": oom["summary"],
            "history_left_out": False,
            "ring": oom.get("ring"),
            "checkpoint": oom.get("checkpoint"),
            # Hook 1.5: the history before the checkpoint, in pieces (History.of).
            "history": oom.get("history"),
            # When the job's optimizers stepped (time.time(); the trace's time_us is the same
            # clock in microseconds): `empty_cache()` between steps is replayed there.
            "steps": oom.get("steps") or [],
            # Hook 1.14: where no step was marked, where the job's passes began (PassMarks).
            "passes": oom.get("passes") or [],
            "accumulating": oom.get("accumulating") or 0,
            # The job's allocated bytes from its start ([time_s, low, high] rows), the
            # GPU's own total, and every process NVML listed on it (hook 1.4).
            "series": oom.get("series"),
            "step_series": oom.get("step_series"),
            "physical_total_bytes": oom.get("physical_total_bytes"),
            "gpu_processes": oom.get("gpu_processes"),
            # What the live memory was for (parameters, gradients, optimizer state), as
            # the job's own tensors said at the OOM (hook 1.4).
            "roles": oom.get("roles"),
            # A launcher's rank (hook 1.10): which rank of a torchrun job ran out.
            "rank": env_int("RANK"),
            "world_size": env_int("WORLD_SIZE"),
        }
        traces = [list(t) for t in (snapshot.get("device_traces") or [])]
        while len(traces) <= device:
            traces.append([])
        last = traces[device][-1] if traces[device] else None
        if not (isinstance(last, dict) and last.get("action") == "oom"):
            traces[device].append({
                "action": "oom",
                "addr": 0,
                "size": oom["requested_bytes"],
                "stream": 0,
                "device_free": oom["device_free_bytes"],
                "time_us": int(oom["time_s"] * 1e6),
                "frames": [],
                "vramtop_added": True,
            })
        snapshot["device_traces"] = traces
        return snapshot

    def say_once(self, key, text):
        if key not in self.said:
            self.said.add(key)
            self.say(text)

    @staticmethod
    def say(text):
        try:
            sys.stderr.write("vramtop: %s\n" % text)
            sys.stderr.flush()
        except Exception:
            pass


_oom_keeper = OomKeeper()
_excepthooks_installed = False


def after_fork_in_child():
    """The child's OOMs are its own: numbered from 1, in a keeper of its own (whose writer
    registers its flush anew: a second flush of an idle keeper costs nothing)."""
    global _oom_keeper, _threading_exit_registered, _untracked_lock, _untracked_burst
    _oom_keeper = OomKeeper()
    _threading_exit_registered = False
    _untracked_lock = threading.Lock()  # the parent's may have been held at fork
    _untracked_burst = UntrackedBurst()  # its timer thread is the parent's


def on_oom(device, alloc_size, limit_bytes, device_free):
    """PyTorch's OOM observer: sends the allocator's state before the exception unwinds.

    What c10/cuda/CUDACachingAllocator.cpp (DeviceCachingAllocator::malloc) does: when every
    retry has failed it reads cudaMemGetInfo, counts the OOM, copies `oom_observers_`, and
    then `lock.unlock()` ("Make sure we do not have the device lock before calling our
    observers which might need hold the GIL") before calling each observer as
    (device, alloc_size, set_fraction ? allowed_memory_maximum : device_total, device_free),
    and only after them throws OutOfMemoryError. So calling memory_stats / memory_snapshot
    here does not deadlock (the allocator lock is free; it is recursive anyway), the third
    argument is the per-process cap when set_per_process_memory_fraction is in force, and
    alloc_size is the rounded size PyTorch's message says it "Tried to allocate". The Python
    binding (torch/csrc/cuda/Module.cpp) takes the GIL and turns an exception raised here
    into a C++ error that would replace the OOM: so nothing may escape this function.
    """
    try:
        hook = running.hook
        if hook is None or hook.alloc is None or hook.pid != os.getpid():
            return
        alloc = hook.alloc
        # The ring, the checkpoint and the history read as one: a checkpoint under way
        # (it clears the ring before it keeps the new state) ends first, and none begins
        # while they are read (`reading_at_oom`).
        with alloc.reading_at_oom():
            generation = alloc.generation
            raw = alloc.raw_snapshot(on_job_thread=True)
            state = alloc.collect(device=int(device), raw=raw)
            ring = alloc.ring_of(raw, int(device))
            checkpoint = alloc.checkpoint_of(int(device))
            history = alloc.history_of()
            # Only where the wait timed out: a checkpoint came between these reads.
            followed_on = alloc.generation == generation and not alloc.restarting
        stats = state["stats"]
        message = {
            "type": "oom",
            "time_s": time.time(),
            "device": int(device),
            "device_uuid": state.get("device_uuid"),
            "requested_bytes": int(alloc_size),
            "device_free_bytes": int(device_free),
            "device_total_bytes": int(limit_bytes),
            "stats": stats,
            "settings": state["settings"],
            "segments": state["segments"],
            "truncated": state["truncated"],
            "summary": oom_summary(alloc_size, stats, device_free),
            "ring": ring,
            "checkpoint": checkpoint,
            "history": history,
            "steps": list(hook.alloc.steps),
            "passes": list(hook.alloc.passes),
            # Inside a first step accumulating gradients (PassMarks.accumulating), else 0.
            "accumulating": hook.alloc.roles.passes.accumulating() if hook.alloc.roles.passes is not None else 0,
            "series": hook.alloc.series.of(int(device)),
            "step_series": hook.alloc.step_series.of(int(device)),
            "roles": hook.alloc.roles.at_oom(int(device)),
        }
        if not followed_on:
            # The ring read above and the checkpoint and history do not follow on from each
            # other: the state at the OOM stands alone.
            if message["ring"]:
                message["ring"] = dict(message["ring"], complete=False)
            message["checkpoint"] = message["history"] = None
        # The processes sharing the GPU and its own total: who else held the memory.
        message.update(who_holds_the_gpu(hook.alloc, int(device)))
        # The file first: a job that dies of this OOM may be gone before a viewer reads.
        # A viewer replays the job's history from it when the ring holds all of it. In a
        # burst both come from the keeper's writer thread, for the newest OOM (`take`).
        if raw is None:
            tell(hook, message, None)
        else:
            _oom_keeper.take(raw, message, lambda path: tell(hook, message, path))
    except Exception:
        pass


def tell(hook, message, kept_path):
    """The OOM to viewers, with the file it was kept in (or None). Never raises."""
    try:
        message["kept_path"] = kept_path
        # The checkpoint's segments are for the file (a replay starts from them), not the wire.
        message.pop("checkpoint", None)
        message.pop("history", None)
        message.pop("steps", None)
        message.pop("passes", None)
        message.pop("accumulating", None)
        frame = encode_fitting(message)
        if frame is None:
            return
        hook.keep_and_tell("oom", frame)  # kept even before we listen: the first viewer gets it
    except Exception:
        pass


def flush_kept(ending=True):
    """A burst's newest OOM kept and told (OomKeeper.flush), and the newest untracked OOM's
    words (flush_untracked): before the job ends, or (`ending` False) before a thread's
    uncaught exception is reported."""
    _oom_keeper.flush(ending=ending)
    flush_untracked()


_threading_exit_registered = False


def register_threading_exit():
    """flush_kept at threading's shutdown too, once a process (a forked child inherits it,
    and flush_kept finds the child's own keeper): normal exits run it before atexit, and a
    multiprocessing worker, which ends with os._exit, runs only it."""
    global _threading_exit_registered
    if _threading_exit_registered:
        return
    _threading_exit_registered = True
    try:
        threading._register_atexit(flush_kept)
    except Exception:
        pass  # Python before 3.9, or shutdown begun: atexit and the excepthook remain


def oom_summary(alloc_size, stats, device_free):
    """PyTorch's own figures in PyTorch's own words, for jobs that catch the OOM."""
    allocated = stats.get("allocated_bytes") or 0
    reserved = stats.get("reserved_bytes") or 0
    return (
        "Tried to allocate %s; %s free on the device; %s is allocated by PyTorch, and %s "
        "is reserved by PyTorch but unallocated."
        % (
            format_size(int(alloc_size)),
            format_size(int(device_free)),
            format_size(allocated),
            format_size(max(reserved - allocated, 0)),
        )
    )


def install_excepthooks():
    """Chain sys.excepthook and threading.excepthook: report, then run the user's hook."""
    global _excepthooks_installed
    if _excepthooks_installed:
        return
    _excepthooks_installed = True
    previous_sys = sys.excepthook

    def vramtop_excepthook(kind, value, traceback):
        report_uncaught(kind, value)
        previous_sys(kind, value, traceback)

    sys.excepthook = vramtop_excepthook
    if hasattr(threading, "excepthook"):
        previous_thread = threading.excepthook

        def vramtop_thread_excepthook(args):
            report_uncaught(args.exc_type, args.exc_value)
            previous_thread(args)

        threading.excepthook = vramtop_thread_excepthook


def report_uncaught(kind, value):
    try:
        hook = running.hook
        if hook is None or hook.pid != os.getpid():
            return
        # A burst's newest OOM, perhaps the one the job dies of, goes before the error.
        flush_kept(ending=threading.current_thread() is threading.main_thread())
        if kind is None or issubclass(kind, (KeyboardInterrupt, SystemExit)):
            return  # Python exits 130 / the code given, not 1: leave exit_code unknown
        message = {
            "type": "error",
            "time_s": time.time(),
            "kind": getattr(kind, "__name__", str(kind)),
            "message": str(value)[:65536],
        }
        main = threading.current_thread() is threading.main_thread()
        if main:
            hook.uncaught = True
        oom = oom_of(value)
        if oom is not None:
            keep_untracked_oom(hook, oom)
            # Which `untracked_oom` the job dies of (the viewer then says no "went on").
            if untracked_number(oom) is not None:
                message["oom_number"] = untracked_number(oom)
        if main and oom is not None:
            # Last: `vramtop run` explains a marked process from its kept files.
            mark_dying_of_oom(message)
        frame = encode(message)
        hook.keep_and_tell("error", frame)
    except Exception:
        pass


def oom_of(error):
    """PyTorch's OutOfMemoryError that `error` is or was raised from (a framework that
    wraps it: `raise RuntimeError(...) from err`, or raises in its handler); None."""
    for _ in range(16):  # a chain that loops on itself ends here
        if error is None:
            return None
        if type(error).__name__ == "OutOfMemoryError":
            return error
        error = error.__cause__ or error.__context__
    return None


def write_beside_kept(rest, fields):
    """`fields` as JSON in `OomKeeper.path_of(rest)`, whole or not at all (a reader never
    sees half a file)."""
    import json

    path = _oom_keeper.path_of(rest)
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    # A temporary of this thread's own: two threads may keep the same name at once.
    temporary = "%s.%d.%d.tmp" % (path, os.getpid(), threading.get_ident())
    try:
        with open(temporary, "w") as f:
            json.dump(fields, f)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def mark_dying_of_oom(message):
    """A process of a batch `vramtop run` dying of an OOM (its main thread's uncaught
    exception, or one raised from it), marked as `vramtop-oom-TAG-PID-dying.json` beside
    its kept files: if the job has not ended soon after, `vramtop run` explains this
    process's OOM then, not after the job. A torchrun job whose rank ran out can wait for
    good (seen on two H200s with destroy_process_group at exit, with or without vramtop),
    and its user would see nothing until they killed it. Only under a batch `vramtop run`
    (its tag and VRAMTOP_OOM_QUIET=1 set; it removes the marks after the job). Never
    raises."""
    try:
        if not os.environ.get("VRAMTOP_OOM_TAG") or os.environ.get("VRAMTOP_OOM_QUIET") != "1":
            return
        write_beside_kept("dying.json", {"kind": message["kind"], "time_s": message["time_s"]})
    except Exception:
        pass


def keep_untracked_oom(hook, oom):
    """An OOM the job dies of (`oom`, PyTorch's exception) under a backend that tracks no
    blocks (cudaMallocAsync): no observer saw it and there is no state to keep, so
    PyTorch's words are kept instead, for `vramtop run` to explain after a batch job. The
    file `watch_untracked_ooms` kept when the exception was made is marked `uncaught`;
    where none was (the class could not be wrapped), `vramtop-oom-[TAG-]PID-untracked.json`
    is written now. Never raises."""
    try:
        alloc = hook.alloc
        if alloc is None or not alloc.blocks_untracked():
            return
        number = untracked_number(oom)
        fields = untracked_fields(alloc, oom, number)
        fields["uncaught"] = True
        with _untracked_lock:
            # `last` holds a newer OOM by now (another thread's): that one stays.
            if number is None or number <= OOM_FIRST_KEPT or number == hook.untracked_ooms:
                _untracked_burst.pending = None  # this one, or an older one
                write_beside_kept(untracked_rest(number), fields)
    except Exception:
        pass


def untracked_number(oom):
    """The number `untracked_oom_seen` gave this very exception in this process; None for
    one it never saw, or a copy (copy.copy and unpickling carry the attribute over to a
    new object, from another process too)."""
    mark = getattr(oom, "_vramtop_oom", None)
    if isinstance(mark, tuple) and len(mark) == 3 and mark[:2] == (os.getpid(), id(oom)):
        return mark[2]
    return None


# Numbers the OOMs `watch_untracked_ooms` sees and orders their files: two threads can
# run out at once. Made anew in a forked child.
_untracked_lock = threading.Lock()


class UntrackedBurst:
    """A burst of untracked OOMs (past the first OOM_FIRST_KEPT, each within OOM_BURST_S of
    the one before: a job that catches an OOM every step) leaves the job's thread free of
    files, as OomKeeper's writer does for states: the newest one's words wait in `pending`,
    and a timer thread writes them at most once an OOM_BURST_S; flush_kept writes them
    before the job ends. An OOM on its own is kept at once, on the job's thread (a small
    JSON file: 221 us on the 2-core build machine's disk). Read and changed under
    _untracked_lock."""

    def __init__(self):
        self.last_at = None  # time.monotonic() of the last OOM
        self.pending = None  # the fields of the newest OOM not yet written
        self.timer = None


_untracked_burst = UntrackedBurst()


def keep_untracked_words(number, fields):
    """Under _untracked_lock, on the job's thread: the words of OOM `number` written now,
    or, in a burst, left to the burst's timer."""
    now = time.monotonic()
    burst = _untracked_burst
    in_a_burst = (number > OOM_FIRST_KEPT and burst.last_at is not None
                  and now - burst.last_at < OOM_BURST_S)
    burst.last_at = now
    if not in_a_burst:
        burst.pending = None
        write_beside_kept(untracked_rest(number), fields)
        return
    burst.pending = fields
    if burst.timer is None:
        timer = threading.Timer(OOM_BURST_S, flush_untracked)
        timer.daemon = True
        timer.start()  # may fail at the interpreter's shutdown: the next OOM tries again
        burst.timer = timer


def flush_untracked():
    """The newest untracked OOM a burst left unwritten, written now (the burst's timer, or
    flush_kept as the job ends). Never raises."""
    try:
        with _untracked_lock:
            burst = _untracked_burst
            pending, burst.pending, burst.timer = burst.pending, None, None
            if pending is not None:
                write_beside_kept(untracked_rest(pending["number"]), pending)
    except Exception:
        pass


def watch_untracked_ooms(hook):
    """Under a backend that tracks no blocks (cudaMallocAsync, a pluggable allocator)
    PyTorch calls no OOM observer, so an OOM the job catches (a batch-size finder's, a
    retry with a smaller batch) would pass unseen. PyTorch makes its OutOfMemoryError from
    C++ by calling the class (PyErr_SetString), so the class's __init__ runs once for each
    OOM, caught or not (seen on the H200 under both backends, PyTorch 2.11): wrapped here,
    it keeps PyTorch's words and tells viewers (`untracked_oom_seen`). An OutOfMemoryError
    made otherwise counts too (the job's own, a framework's re-raise as a new one, a copy or
    an unpickled one); no other exception meets it. Returns whether it is wrapped; never
    raises."""
    try:
        torch = hook.torch
        cls = getattr(torch, "OutOfMemoryError", None) or getattr(getattr(torch, "cuda", None),
                                                                 "OutOfMemoryError", None)
        if cls is None:
            return False
        if getattr(cls.__init__, "_vramtop_watch", False):
            return True
        original = cls.__init__

        def __init__(self, *args, **kwargs):
            original(self, *args, **kwargs)
            untracked_oom_seen(self)

        __init__._vramtop_watch = True
        cls.__init__ = __init__
        return True
    except Exception:
        return False


def untracked_oom_seen(oom):
    """An OutOfMemoryError just made under a backend that tracks no blocks: numbered,
    its words kept beside the job's other kept files (`vramtop-oom-[TAG-]PID-N-untracked.json`,
    N = 1 to OOM_FIRST_KEPT, then `last`), and told to viewers as `untracked_oom`. On the
    job's thread, at its OOM only; not in a forked child, whose parent's sockets it holds
    (its own hook, if it starts one, is another). Never raises."""
    try:
        hook = running.hook
        if hook is None or hook.pid != os.getpid() or hook.alloc is None or not hook.alloc.blocks_untracked():
            return
        # Numbered, kept and told in order: `last` and a late viewer get the newest.
        with _untracked_lock:
            hook.untracked_ooms += 1
            number = hook.untracked_ooms
            oom._vramtop_oom = (os.getpid(), id(oom), number)
            fields = untracked_fields(hook.alloc, oom, number)
            try:
                keep_untracked_words(number, fields)
            except Exception:
                pass  # a folder that cannot be written: the viewers are still told
            frame = encode({"type": "untracked_oom", "time_s": time.time(), "number": number,
                            "message": fields["message"]})
            # The server's lock is taken inside this one, never the other way round: the
            # hook's thread never takes _untracked_lock, the burst's timer no server lock.
            hook.keep_and_tell("untracked_oom", frame)
    except Exception:
        pass


def untracked_fields(alloc, oom, number):
    fields = {"backend": alloc.backend, "kind": type(oom).__name__, "message": str(oom)[:65536]}
    if number is not None:
        fields["number"] = number
    return fields


def untracked_rest(number):
    """The end of a kept untracked OOM's file name: its number's, else the one per process
    hooks before 1.11 wrote."""
    if number is None:
        return "untracked.json"
    return "%s-untracked.json" % (number if number <= OOM_FIRST_KEPT else "last")
