"""Every OOM of a hooked job is kept on disk, viewer or not (OomKeeper in the hook): a
PyTorch memory snapshot per OOM, bounded (the first 3 and the latest), never breaking the
job, one line on stderr when it cannot write. Real job processes under the real bootstrap,
against the stub torch (SIMULATED)."""

import json
import os
import pickle
import shutil
import sys
import tempfile
import threading
import time
import unittest
import weakref

from support import Job, KeptFilesTest, Viewer, wait_for

MiB = 1024 * 1024


class OomKeepTest(unittest.TestCase):
    def setUp(self):
        self.jobs = []
        self.oom_dir = tempfile.mkdtemp(prefix="vth-oom-")

    def tearDown(self):
        for job in self.jobs:
            job.kill()
        Viewer.close_all()
        os.chmod(self.oom_dir, 0o700)
        shutil.rmtree(self.oom_dir, ignore_errors=True)

    def ready_job(self, **env):
        env.setdefault("VRAMTOP_OOM_DIR", self.oom_dir)
        job = Job(**env)
        self.jobs.append(job)
        job.do("import")
        job.wait_socket()
        job.do("init")
        job.do("alloc a %d" % (3 * MiB))
        Viewer(job.socket_path).ready_hello()  # the hook has seen CUDA come up
        return job

    def kept(self):
        return sorted(n for n in os.listdir(self.oom_dir) if n.endswith(".pickle"))

    def test_an_oom_with_no_viewer_is_kept_as_a_pytorch_snapshot(self):
        job = self.ready_job(VRAMTOP_OOM_TAG="run7", VRAMTOP_RING="0")
        self.assertEqual(job.do("oom %d" % (1024 * MiB)), "ok caught OutOfMemoryError")
        name = "vramtop-oom-run7-%d-1.pickle" % job.proc.pid
        self.assertEqual(self.kept(), [name])
        with open(os.path.join(self.oom_dir, name), "rb") as f:
            snapshot = pickle.load(f)
        # PyTorch's own dict, as _snapshot() gave it...
        self.assertEqual(sum(s["total_size"] for s in snapshot["segments"]), 4 * MiB)
        self.assertIn("allocator_settings", snapshot)
        # ...with what the snapshot alone lacks: the request and the device's figures.
        oom = snapshot["vramtop_oom"]
        self.assertEqual(oom["number"], 1)
        self.assertEqual(oom["pid"], job.proc.pid)
        self.assertEqual(oom["requested_bytes"], 1024 * MiB)
        self.assertEqual(oom["device_free_bytes"], 8 * 1024 * MiB - 4 * MiB)
        self.assertIn("Tried to allocate 1024.00 MiB", oom["summary"])
        self.assertFalse(oom["history_left_out"])
        # No stacks recorded: nothing imported to read them (torch._inductor costs seconds).
        self.assertEqual(job.do("inductor?"), "ok none")
        # History off: one `oom` entry as PyTorch writes them, marked as ours.
        entry = snapshot["device_traces"][0][-1]
        self.assertEqual(entry["action"], "oom")
        self.assertEqual(entry["size"], 1024 * MiB)
        self.assertTrue(entry["vramtop_added"])
        rc, _, err = job.finish()
        self.assertEqual(rc, 0)
        self.assertIn("vramtop: OOM 1: allocator state kept in %s" % os.path.join(self.oom_dir, name), err)
        self.assertIn("open it with: vramtop snapshot", err)

    def test_the_event_ring_holds_the_jobs_whole_history_up_to_the_oom(self):
        # Without free_requested where PyTorch can skip it (hook 1.7), with it where not.
        for lacks, requested in (("", []), ("skip_actions", ["free_requested"])):
            with self.subTest(lacks=lacks):
                for name in self.kept():
                    os.remove(os.path.join(self.oom_dir, name))
                job = self.ready_job(STUB_TORCH_LACKS=lacks)  # 3 MiB allocated as `a`
                job.do("alloc b %d" % (5 * MiB))
                job.do("free a")
                self.assertEqual(job.do("oom %d" % (1024 * MiB)), "ok caught OutOfMemoryError")
                (name,) = self.kept()
                with open(os.path.join(self.oom_dir, name), "rb") as f:
                    snapshot = pickle.load(f)
                actions = [e["action"] for e in snapshot["device_traces"][0]]
                self.assertEqual(actions, ["segment_alloc", "alloc", "segment_alloc", "alloc"]
                                 + requested + ["free_completed", "oom"])
                self.assertFalse(any(e.get("vramtop_added") for e in snapshot["device_traces"][0]))
                self.assertEqual(snapshot["vramtop_oom"]["ring"], {
                    "max_entries": 32768, "entries": len(actions), "complete": True, "checkpoint": False})
                self.assertIsNone(snapshot["vramtop_oom"]["checkpoint"])
                self.assertEqual(job.finish()[0], 0)

    def test_the_jobs_optimizer_steps_are_kept_for_a_replay(self):
        job = self.ready_job()
        before = time.time()
        for n in range(3):
            job.do("alloc s%d %d" % (n, MiB))
            job.do("step")
        self.assertEqual(job.do("oom %d" % (1024 * MiB)), "ok caught OutOfMemoryError")
        (name,) = self.kept()
        with open(os.path.join(self.oom_dir, name), "rb") as f:
            oom = pickle.load(f)["vramtop_oom"]
        steps = oom["steps"]
        self.assertEqual(len(steps), 3)
        # Allocated just after the first step (the next ones came within a period).
        self.assertEqual([r[1] for r in oom["step_series"]["rows"]], [4 * MiB], oom["step_series"])
        self.assertTrue(before <= steps[0] <= steps[1] <= steps[2] <= time.time(), steps)
        self.assertEqual(job.finish()[0], 0)

    def test_a_step_gradscaler_skipped_is_marked_once_as_a_step_it_ran(self):
        # fp16 with infs: GradScaler.step runs no optimizer step, so the post-step hook
        # marks nothing; the iteration still ends there.
        job = self.ready_job()
        for n, cmd in enumerate(["step", "scaler_skip", "scaler_step", "scaler_skip"]):
            job.do("alloc s%d %d" % (n, MiB))
            job.do(cmd)
        self.assertEqual(job.do("oom %d" % (1024 * MiB)), "ok caught OutOfMemoryError")
        (name,) = self.kept()
        with open(os.path.join(self.oom_dir, name), "rb") as f:
            oom = pickle.load(f)["vramtop_oom"]
        # One mark each: the step the scaler ran is marked by the post-step hook alone.
        steps = oom["steps"]
        self.assertEqual(len(steps), 4, steps)
        self.assertEqual(steps, sorted(steps))
        self.assertEqual(job.finish()[0], 0)

    def test_the_jobs_allocated_series_and_the_gpus_own_total_are_kept(self):
        job = self.ready_job(VRAMTOP_RING="0")  # 3 MiB allocated as `a`
        for n in range(3):
            job.do("alloc g%d %d" % (n, MiB))
            time.sleep(0.6)  # a sample each SERIES_PERIOD_S (0.5 s)
        self.assertEqual(job.do("oom %d" % (1024 * MiB)), "ok caught OutOfMemoryError")
        (name,) = self.kept()
        with open(os.path.join(self.oom_dir, name), "rb") as f:
            oom = pickle.load(f)["vramtop_oom"]
        rows = oom["series"]["rows"]
        self.assertGreaterEqual(len(rows), 3, rows)
        lows = [low for _, low, _ in rows]
        self.assertEqual(lows, sorted(lows), rows)  # it only ever grew
        self.assertEqual(lows[-1], 6 * MiB, rows)
        self.assertTrue(all(low <= high for _, low, high in rows), rows)
        self.assertEqual(oom["physical_total_bytes"], 8 * 1024 * MiB)
        # No NVML on this machine (or the stub GPU unknown to it): said as unknown, not empty.
        self.assertIsNone(oom["gpu_processes"])
        self.assertEqual(job.finish()[0], 0)

    def test_a_ring_is_complete_only_while_it_never_filled(self):
        job = self.ready_job(VRAMTOP_RING="4")  # `a` made 2 entries
        for n in range(3):
            job.do("alloc b%d %d" % (n, MiB))
        self.assertEqual(job.do("oom %d" % (1024 * MiB)), "ok caught OutOfMemoryError")
        (name,) = self.kept()
        with open(os.path.join(self.oom_dir, name), "rb") as f:
            ring = pickle.load(f)["vramtop_oom"]["ring"]
        # Wrapped (the hook's look at the allocation count came too late): not complete;
        # else it was checkpointed in time and holds every event since.
        self.assertEqual(ring["complete"], ring["entries"] < 4, ring)
        self.assertEqual(job.finish()[0], 0)

    def test_a_ring_started_after_the_first_allocation_replays_from_a_checkpoint(self):
        # Started by hand after CUDA and an allocation: the ring lacks the job's start, so
        # the hook checkpoints at once: the segments then, and every event since.
        job = Job(VRAMTOP_OOM_DIR=self.oom_dir, VRAMTOP_HOOK="0")
        self.jobs.append(job)
        job.do("import")
        job.do("init")
        job.do("alloc a %d" % MiB)
        job.do("start")
        job.wait_socket()
        Viewer(job.socket_path).ready_hello()
        wait_for(lambda: (lambda c: c if "'clear_history': True" in c else None)(job.do("history")), timeout=5)
        job.do("alloc b %d" % (3 * MiB))
        self.assertEqual(job.do("oom %d" % (1024 * MiB)), "ok caught OutOfMemoryError")
        (name,) = self.kept()
        with open(os.path.join(self.oom_dir, name), "rb") as f:
            snapshot = pickle.load(f)
        ring = snapshot["vramtop_oom"]["ring"]
        self.assertEqual((ring["complete"], ring["checkpoint"]), (True, True), ring)
        checkpoint = snapshot["vramtop_oom"]["checkpoint"]
        sizes = [b["size"] for s in checkpoint["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
        self.assertEqual(sizes, [MiB])  # `a`, not `b`
        self.assertEqual(checkpoint["skip"], 0)
        actions = [e["action"] for e in snapshot["device_traces"][0][checkpoint["skip"]:]]
        self.assertEqual(actions, ["segment_alloc", "alloc", "oom"])
        self.assertEqual(job.finish()[0], 0)

    def test_the_first_three_and_the_latest_are_kept(self):
        job = self.ready_job()
        for size in (100, 200, 300, 400, 500):
            self.assertEqual(job.do("oom %d" % (size * MiB)), "ok caught OutOfMemoryError")
        pid = job.proc.pid
        # The fourth and fifth came in a burst: the writer thread keeps the newest, and
        # the job's exit waits for it.
        rc, _, err = job.finish()
        self.assertEqual(rc, 0)
        self.assertEqual(
            self.kept(),
            ["vramtop-oom-%d-%s.pickle" % (pid, n) for n in ("1", "2", "3", "last")],
        )
        with open(os.path.join(self.oom_dir, "vramtop-oom-%d-last.pickle" % pid), "rb") as f:
            last = pickle.load(f)["vramtop_oom"]
        self.assertEqual((last["number"], last["requested_bytes"]), (5, 500 * MiB))
        # Said for the first three and the first rewrite, not for every later OOM.
        self.assertEqual(err.count("allocator state kept in"), 4, err)
        self.assertIn("later OOMs rewrite it", err)

    def test_a_directory_that_cannot_be_written_is_one_line_and_the_job_goes_on(self):
        if os.geteuid() == 0:
            blocked = os.path.join(self.oom_dir, "a-file")
            with open(blocked, "w") as f:
                f.write("not a directory")
            where = os.path.join(blocked, "sub")  # root writes anywhere, but not under a file
        else:
            os.chmod(self.oom_dir, 0o500)
            where = self.oom_dir
        job = self.ready_job(VRAMTOP_OOM_DIR=where)
        for _ in range(3):
            self.assertEqual(job.do("oom %d" % (64 * MiB)), "ok caught OutOfMemoryError")
        self.assertEqual(job.do("pace 3")[:2], "ok")
        rc, _, err = job.finish()
        self.assertEqual(rc, 0)
        lines = [l for l in err.splitlines() if "could not keep the allocator state" in l]
        self.assertEqual(len(lines), 1, err)
        self.assertTrue(lines[0].startswith("vramtop: "), lines[0])
        self.assertIn("the job goes on", lines[0])

    def test_an_uncaught_oom_is_kept_and_the_job_still_dies_of_it(self):
        job = self.ready_job()
        job.proc.stdin.write("oom_uncaught %d\n" % (2048 * MiB))
        job.proc.stdin.flush()
        rc, _, err = job.finish()
        self.assertEqual(rc, 1)
        self.assertIn("OutOfMemoryError", err)
        self.assertEqual(self.kept(), ["vramtop-oom-%d-1.pickle" % job.proc.pid])

    def test_a_batch_runs_process_dying_of_an_oom_is_marked_for_it(self):
        # Only a batch `vramtop run` (its tag and quiet set) waits on the mark; a caught OOM
        # leaves none, and nor does a job run otherwise.
        marks = lambda: sorted(n for n in os.listdir(self.oom_dir) if n.endswith("-dying.json"))  # noqa: E731
        job = self.ready_job(VRAMTOP_OOM_TAG="run9", VRAMTOP_OOM_QUIET="1")
        self.assertEqual(job.do("oom %d" % MiB), "ok caught OutOfMemoryError")
        self.assertEqual(marks(), [])
        job.proc.stdin.write("oom_uncaught %d\n" % (2048 * MiB))
        job.proc.stdin.flush()
        rc, _, _ = job.finish()
        self.assertEqual(rc, 1)
        name = "vramtop-oom-run9-%d-dying.json" % job.proc.pid
        self.assertEqual(marks(), [name])
        with open(os.path.join(self.oom_dir, name)) as f:
            self.assertEqual(json.load(f)["kind"], "OutOfMemoryError")
        other = self.ready_job(VRAMTOP_OOM_TAG="run9")
        other.proc.stdin.write("oom_uncaught %d\n" % (2048 * MiB))
        other.proc.stdin.flush()
        self.assertEqual(other.finish()[0], 1)
        self.assertEqual(marks(), [name])
        # An OOM a framework wraps in its own error is still what the process died of;
        # another error is not.
        wrapped = self.ready_job(VRAMTOP_OOM_TAG="run9", VRAMTOP_OOM_QUIET="1")
        wrapped.proc.stdin.write("oom_wrapped %d\n" % (2048 * MiB))
        wrapped.proc.stdin.flush()
        rc, _, err = wrapped.finish()
        self.assertEqual(rc, 1)
        self.assertIn("RuntimeError: training step failed", err)
        self.assertIn("vramtop-oom-run9-%d-dying.json" % wrapped.proc.pid, marks())
        crashed = self.ready_job(VRAMTOP_OOM_TAG="run9", VRAMTOP_OOM_QUIET="1")
        crashed.proc.stdin.write("crash\n")
        crashed.proc.stdin.flush()
        self.assertIn("ValueError: not memory", crashed.finish()[2])
        self.assertEqual(len(marks()), 2, marks())

    def test_under_cuda_malloc_async_every_oom_is_seen_as_pytorch_makes_it_caught_or_not(self):
        # That backend calls no OOM observer: the hook wraps OutOfMemoryError's __init__,
        # which PyTorch calls for each OOM (PyErr_SetString). Caught ones are told and kept,
        # numbered; the one the job dies of is marked uncaught, and its error names it.
        untracked = lambda: sorted(n for n in os.listdir(self.oom_dir) if n.endswith("-untracked.json"))  # noqa: E731
        job = self.ready_job(VRAMTOP_OOM_TAG="run5", PYTORCH_CUDA_ALLOC_CONF="backend:cudaMallocAsync")
        viewer = Viewer(job.socket_path)
        viewer.ready_hello()
        prefix = "vramtop-oom-run5-%d-" % job.proc.pid
        began = time.monotonic()
        for size in (100, 200, 300, 400, 500):
            self.assertEqual(job.do("oom %d" % (size * MiB)), "ok caught OutOfMemoryError")
            told = viewer.recv_type("untracked_oom")
            self.assertIn("Requested               : %d.00 MiB" % size, told["message"])
        quick = time.monotonic() - began < 0.5
        self.assertEqual(told["number"], 5)
        # The fourth and fifth came in a burst: their words wait off the job's thread, and
        # the burst's timer writes the newest a second on (OOM_BURST_S).
        if quick:
            self.assertNotIn(prefix + "last-untracked.json", untracked())
        last_path = os.path.join(self.oom_dir, prefix + "last-untracked.json")
        self.assertTrue(wait_for(lambda: os.path.exists(last_path), timeout=5))
        # The first three and the latest, as the native allocator's states are kept.
        self.assertEqual(untracked(), [prefix + rest for rest in
                                       ("1-untracked.json", "2-untracked.json", "3-untracked.json",
                                        "last-untracked.json")])
        with open(last_path) as f:
            last = json.load(f)
        self.assertEqual((last["backend"], last["number"], last.get("uncaught")), ("cudaMallocAsync", 5, None))
        self.assertIn("500.00 MiB", last["message"])
        self.assertEqual(self.kept(), [])  # no state under this backend, no pickle
        # A viewer that comes later is told the latest.
        late = Viewer(job.socket_path)
        self.assertEqual(late.recv_type("untracked_oom")["number"], 5)
        # The one it dies of: told, kept as `last`, marked, and named by the error.
        job.proc.stdin.write("oom_uncaught %d\n" % (2048 * MiB))
        job.proc.stdin.flush()
        self.assertEqual(viewer.recv_type("untracked_oom")["number"], 6)
        error = viewer.recv_type("error")
        self.assertEqual((error["kind"], error["oom_number"]), ("OutOfMemoryError", 6))
        rc, _, err = job.finish()
        self.assertEqual(rc, 1)
        self.assertEqual([line for line in err.splitlines() if line.startswith("vramtop")], [], err)
        with open(os.path.join(self.oom_dir, prefix + "last-untracked.json")) as f:
            last = json.load(f)
        self.assertEqual((last["number"], last["uncaught"]), (6, True))
        self.assertIn("2.00 GiB", last["message"])
        # A copy of an OOM (copy.copy, unpickling: from another process too) brings the
        # original's attribute along: its number is not trusted for the copy.
        copied = self.ready_job(VRAMTOP_OOM_TAG="run6", PYTORCH_CUDA_ALLOC_CONF="backend:cudaMallocAsync")
        copied.proc.stdin.write("oom_copied_uncaught %d\n" % (2048 * MiB))
        copied.proc.stdin.flush()
        self.assertEqual(copied.finish()[0], 1)
        with open(os.path.join(self.oom_dir, "vramtop-oom-run6-%d-1-untracked.json" % copied.proc.pid)) as f:
            first = json.load(f)
        self.assertNotIn("uncaught", first)  # the copy died, not the first one: not marked
        # The copy is an OOM made anew (counted: its own number); the words it died of are
        # kept unnumbered, marked (its number went with the original's attribute).
        with open(os.path.join(self.oom_dir, "vramtop-oom-run6-%d-untracked.json" % copied.proc.pid)) as f:
            self.assertTrue(json.load(f)["uncaught"])
        # A burst's newest is written as the job ends, before its timer would have.
        ending = self.ready_job(VRAMTOP_OOM_TAG="run7", PYTORCH_CUDA_ALLOC_CONF="backend:cudaMallocAsync")
        for size in (100, 200, 300, 400, 500, 600):
            self.assertEqual(ending.do("oom %d" % (size * MiB)), "ok caught OutOfMemoryError")
        self.assertEqual(ending.finish()[0], 0)
        with open(os.path.join(self.oom_dir, "vramtop-oom-run7-%d-last-untracked.json" % ending.proc.pid)) as f:
            self.assertEqual(json.load(f)["number"], 6)
        # The native allocator's jobs are left alone: their observer sees every OOM.
        native = self.ready_job(VRAMTOP_OOM_TAG="run5")
        self.assertEqual(native.do("oom %d" % MiB), "ok caught OutOfMemoryError")
        self.assertEqual(len([n for n in untracked() if n.startswith(prefix)]), 4)

    def test_a_job_that_dies_of_the_last_oom_of_a_burst_keeps_that_one(self):
        job = self.ready_job()
        for size in (100, 200, 300, 400):
            self.assertEqual(job.do("oom %d" % (size * MiB)), "ok caught OutOfMemoryError")
        job.proc.stdin.write("oom_uncaught %d\n" % (2048 * MiB))
        job.proc.stdin.flush()
        rc, _, err = job.finish()
        self.assertEqual(rc, 1)
        self.assertIn("OutOfMemoryError", err)
        with open(os.path.join(self.oom_dir, "vramtop-oom-%d-last.pickle" % job.proc.pid), "rb") as f:
            last = pickle.load(f)["vramtop_oom"]
        self.assertEqual((last["number"], last["requested_bytes"]), (5, 2048 * MiB))

    def test_over_the_size_cap_nothing_is_written_and_it_is_said(self):
        job = self.ready_job(VRAMTOP_OOM_MAX_MB="0.0001")
        self.assertEqual(job.do("oom %d" % MiB), "ok caught OutOfMemoryError")
        rc, _, err = job.finish()
        self.assertEqual(rc, 0)
        self.assertEqual(self.kept(), [])
        self.assertIn("over VRAMTOP_OOM_MAX_MB (0.0001); not kept", err)

    def test_quiet_keeps_the_file_and_says_nothing(self):
        job = self.ready_job(VRAMTOP_OOM_QUIET="1")
        self.assertEqual(job.do("oom %d" % MiB), "ok caught OutOfMemoryError")
        rc, _, err = job.finish()
        self.assertEqual(rc, 0)
        self.assertEqual(len(self.kept()), 1)
        self.assertNotIn("vramtop: OOM", err)


class OomKeeperUnitTest(KeptFilesTest):
    """The keeper alone, in this process, on hand-made snapshots."""

    def oom(self):
        return {"device": 0, "time_s": 1.0, "requested_bytes": 64 * MiB, "device_free_bytes": 0,
                "device_total_bytes": 8 << 30, "stats": {}, "summary": "Tried to allocate 64.00 MiB"}

    def test_over_the_cap_history_goes_but_pytorchs_oom_entry_stays(self):
        frames = [{"filename": "train.py", "line": n, "name": "step"} for n in range(50)]
        # Distinct frames per entry, as a long history has: pickle cannot share them.
        history = [
            {"action": "alloc", "addr": n, "size": 512, "stream": 0,
             "frames": [{"filename": "train_%d.py" % n, "line": n, "name": "step_%d" % n}] * 2}
            for n in range(20000)
        ]
        history.append({"action": "oom", "addr": 0, "size": 64 * MiB, "stream": 0, "device_free": 0, "frames": frames})
        raw = {"segments": [], "device_traces": [history]}
        self.hook.oom.OOM_MAX_MB = 0.25
        path = self.hook.oom.OomKeeper().keep(raw, self.oom())
        self.assertIsNotNone(path)
        with open(path, "rb") as f:
            kept = pickle.load(f)
        self.assertTrue(kept["vramtop_oom"]["history_left_out"])
        self.assertEqual([e["action"] for e in kept["device_traces"][0]], ["oom"])
        self.assertNotIn("vramtop_added", kept["device_traces"][0][0], "PyTorch's own entry, not ours")
        # The folder it had to make is private, as a socket folder must be.
        self.assertEqual(os.stat(os.path.dirname(path)).st_mode & 0o777, 0o700)

    def test_a_burst_is_kept_off_the_jobs_thread_newest_last(self):
        oom = self.hook.oom
        saved = oom.OOM_BURST_S
        oom.OOM_BURST_S = 60.0  # the writer waits for the flush: no write races the takes
        self.addCleanup(setattr, oom, "OOM_BURST_S", saved)
        quiet = os.environ.get("VRAMTOP_OOM_QUIET")
        os.environ["VRAMTOP_OOM_QUIET"] = "1"
        self.addCleanup(lambda: os.environ.pop("VRAMTOP_OOM_QUIET") if quiet is None
                        else os.environ.__setitem__("VRAMTOP_OOM_QUIET", quiet))
        keeper = oom.OomKeeper()
        written, told = [], []
        real_keep = keeper._keep

        def keep(raw, message, n):
            written.append((n, threading.current_thread() is threading.main_thread()))
            return real_keep(raw, message, n)

        keeper._keep = keep
        raw = {"segments": [], "device_traces": [[]]}
        for size in range(1, 8):
            message = dict(self.oom(), requested_bytes=size * MiB)
            keeper.take(raw, message, lambda path, size=size: told.append((size, path)))
        # The first three on the job's thread, as each came; none of the burst's there.
        self.assertEqual(written[:3], [(1, True), (2, True), (3, True)])
        keeper.flush()
        self.assertTrue(all(not on_job for n, on_job in written[3:]), written)
        self.assertEqual(written[-1][0], 7, written)
        self.assertEqual(told[-1][0], 7)
        with open(told[-1][1], "rb") as f:
            self.assertEqual(pickle.load(f)["vramtop_oom"]["requested_bytes"], 7 * MiB)
        # After the flush (the job ending) an OOM is kept at once, on its own thread.
        keeper.take(raw, self.oom(), lambda path: told.append((8, path)))
        self.assertEqual(written[-1], (8, True))

    def test_an_older_oom_is_neither_kept_nor_told_after_a_newer_one(self):
        keeper = self.hook.oom.OomKeeper()
        told = []
        keeper.told(6, lambda path: told.append((6, path)), "six")
        keeper.told(5, lambda path: told.append((5, path)), "five")  # the writer, late
        self.assertEqual(told, [(6, "six")])
        raw = {"segments": [], "device_traces": [[]]}
        keeper.last_written = 9  # OOM 9 is in the "last" file
        self.assertTrue(keeper.superseded(5))
        self.assertIsNone(keeper.keep(raw, self.oom(), 5))
        self.assertFalse(keeper.superseded(2))  # the first three are files of their own

    def test_a_multiprocessing_worker_that_dies_in_a_burst_keeps_its_last_oom(self):
        # A worker ends through os._exit: no atexit, no excepthook; only threading's own
        # shutdown waits for the writer, which here would otherwise wait a minute.
        import subprocess
        import sys

        from support import HOOK_DIR

        folder = os.path.join(self.dir, "worker")
        script = """
import multiprocessing, os, sys, time
sys.path.insert(0, %r)

def worker():
    from vramtop_hook import oom
    oom.OOM_BURST_S = 60.0
    raw = {"segments": [], "device_traces": [[]]}
    written = []
    for n in range(1, 6):
        message = {"device": 0, "time_s": 1.0, "requested_bytes": n << 20, "device_free_bytes": 0,
                   "device_total_bytes": 8 << 30, "stats": {}, "summary": "Tried to allocate"}
        oom._oom_keeper.take(raw, message, written.append)
        while n == 4 and not written[3:]:
            time.sleep(0.01)  # the writer keeps the fourth, then waits its minute
    raise RuntimeError("dies of its fifth OOM")

if __name__ == "__main__":
    p = multiprocessing.get_context("fork").Process(target=worker)
    p.start()
    p.join()
    print(p.exitcode)
""" % HOOK_DIR
        env = dict(os.environ, VRAMTOP_OOM_DIR=folder, VRAMTOP_OOM_QUIET="1")
        run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                             text=True, timeout=60)
        self.assertEqual(run.stdout.strip(), "1", run.stderr)
        last = [n for n in os.listdir(folder) if n.endswith("-last.pickle")]
        self.assertEqual(len(last), 1, os.listdir(folder))
        with open(os.path.join(folder, last[0]), "rb") as f:
            self.assertEqual(pickle.load(f)["vramtop_oom"]["requested_bytes"], 5 << 20)

    def test_a_snapshot_that_cannot_be_pickled_is_one_line_not_an_exception(self):
        raw = {"segments": [lambda: None], "device_traces": []}
        self.assertIsNone(self.hook.oom.OomKeeper().keep(raw, self.oom()))


if __name__ == "__main__":
    unittest.main()


class SeriesAndProcessesUnitTest(unittest.TestCase):
    """The allocated series' bounds and the GPU's processes, in this process."""

    def setUp(self):
        import sys

        from support import HOOK_DIR

        if HOOK_DIR not in sys.path:
            sys.path.insert(0, HOOK_DIR)
        import vramtop_hook

        self.hook = vramtop_hook

    def test_a_full_series_merges_pairs_keeping_their_low_and_high(self):
        series = self.hook.roles.AllocatedSeries(period=0.5, limit=8)
        for n in range(8):
            series.add(0, float(n), 100 + (n % 2) * 50 + n)
        rows = series.of(0)["rows"]
        self.assertEqual(len(rows), 4)
        self.assertEqual(series.period, 1.0)
        self.assertEqual(rows[0], [0.0, 100, 151])  # samples 100 and 151
        self.assertEqual(rows[3], [6.0, 106, 157])
        for n in range(100):  # bounded however long the job runs
            series.add(0, 8.0 + n, n)
        self.assertLess(len(series.of(0)["rows"]), 8)
        self.assertEqual(series.of(1), {"period_s": series.period, "rows": []})

    def test_frameworks_are_read_from_mapped_libraries(self):
        import os

        # This interpreter maps no framework; a pid that is not there cannot be read.
        self.assertEqual(self.hook.processes.frameworks_of(os.getpid()), [])
        self.assertIsNone(self.hook.processes.frameworks_of(2 ** 22 + 7))
        facts = self.hook.processes.process_facts(os.getpid())
        self.assertIn("python", facts["command"])
        self.assertIsNotNone(facts["user"])

    def test_the_markers_are_the_viewers(self):
        import os

        from support import HOOK_DIR

        rust = os.path.join(HOOK_DIR, "..", "..", "..", "crates", "vramtop-alloc", "src", "framework.rs")
        with open(rust) as f:
            text = f.read()
        for name, marks in self.hook.processes.FRAMEWORK_MARKERS:
            self.assertIn('"%s"' % name, text)
            for mark in marks:
                self.assertIn('"%s"' % mark, text)


class RoleWatchUnitTest(unittest.TestCase):
    """The roles read off the job's own tensors, on fakes shaped as torch's (SIMULATED)."""

    def setUp(self):
        import sys

        from support import HOOK_DIR

        if HOOK_DIR not in sys.path:
            sys.path.insert(0, HOOK_DIR)
        import vramtop_hook

        self.hook = vramtop_hook

    class Storage:
        def __init__(self, ptr, nbytes):
            self.ptr, self.size = ptr, nbytes

        def data_ptr(self):
            return self.ptr

        def nbytes(self):
            return self.size

    class Tensor:
        def __init__(self, storage, device=0, grad=None):
            self.storage, self.is_cuda, self.grad = storage, device is not None, grad
            self.device = type("Device", (), {"index": device})()

        def untyped_storage(self):
            return self.storage

    @staticmethod
    def model_of(*weights):
        """A model whose parameters are `weights`, with no buffers."""

        class Model:
            def parameters(self):
                return iter(weights)

            def buffers(self):
                return iter([])

        return Model()

    def fake_torch(self):
        Tensor = self.Tensor
        return type("Torch", (), {"is_tensor": staticmethod(lambda t: isinstance(t, Tensor))})()

    def test_each_storage_counts_once_in_its_role_on_its_device(self):
        S, T = self.Storage, self.Tensor
        shared = S(0x1000, 4096)  # tied weights: two parameters, one storage
        w1 = T(shared, grad=T(S(0x9000, 4096)))
        w2 = T(shared)
        bias = T(S(0x2000, 512), grad=T(S(0xA000, 512)))
        other_gpu = T(S(0x3000, 1 << 20), device=1)
        buffer = T(S(0x4000, 1024))

        class Model:
            def parameters(self):
                return iter([w1, w2, bias, other_gpu])

            def buffers(self):
                return iter([buffer])

        class Optimizer:
            param_groups = [{"params": [w1, bias]}]  # the same parameters: counted once
            state = {w1: {"exp_avg": T(S(0xB000, 4096)), "exp_avg_sq": T(S(0xC000, 4096)), "step": 3},
                     bias: {"exp_avg": T(S(0xD000, 512)), "exp_avg_sq": T(S(0xE000, 512))}}

        watch = self.hook.roles.RoleWatch(self.fake_torch())
        model, optimizer = Model(), Optimizer()
        watch.models.add(model)
        watch.optimizers.add(optimizer)
        # With an optimizer, a state never reads gradients itself (the autograd thread
        # writes them): it asks, and the job's next step reads them (the first step reads
        # them unasked, for a job that then pauses).
        self.assertIsNone(watch.of(0))
        self.assertTrue(watch.wanted)
        watch.after_step()
        self.assertFalse(watch.wanted)
        roles = watch.of(0)
        self.assertEqual(roles["parameters"], 4096 + 512 + 1024)
        self.assertEqual(roles["gradients"], 4096 + 512)
        self.assertEqual(roles["optimizer_state"], 2 * 4096 + 2 * 512)
        self.assertEqual((roles["models"], roles["optimizers"]), (1, 1))
        self.assertIsNotNone(roles["time_s"])
        self.assertEqual(watch.of(1)["parameters"], 1 << 20)
        # Steps with no state asking read nothing once a reading exists.
        before = watch.at_step_time
        watch.wanted = False
        watch.after_step()
        self.assertEqual(watch.at_step_time, before)
        fresh = self.hook.roles.RoleWatch(self.fake_torch())
        fresh.optimizers.add(optimizer)
        fresh.after_step()  # no state asked yet: the first step reads all the same
        self.assertEqual(fresh.of(0)["optimizer_state"], 2 * 4096 + 2 * 512)
        # At an OOM, on the thread that hit it: read there and then.
        self.assertEqual(watch.at_oom(0)["gradients"], 4096 + 512)

    def test_parameters_no_optimizer_trains_are_counted_apart_as_frozen(self):
        # A distilling job's teacher (held by no optimizer, whether or not it was frozen
        # with requires_grad_(False)) and a LoRA model's base weights (needing no gradient)
        # are parameters, and "frozen" says how many of their bytes, so that the optimizer's
        # state is told against what it trains ("trained"). Buffers are neither.
        S, T = self.Storage, self.Tensor
        student = T(S(0x1000, 4096), grad=T(S(0x9000, 4096)))
        teacher = T(S(0x2000, 8192))  # under no_grad only: requires_grad left True
        tied = T(S(0x2000, 8192))  # the teacher's tied weight: its storage counts once
        base = T(S(0x3000, 2048))
        base.requires_grad = False
        # FSDP1 with use_orig_params: a trained and a frozen view of one flat storage.
        flat = S(0x5000, 16384)
        adapter_view, base_view = T(flat), T(flat)
        base_view.requires_grad = False
        elsewhere = T(S(0x6000, 1024), device=1)
        buffer = T(S(0x4000, 512))
        buffer.requires_grad = False

        class Model:
            def parameters(self):
                return iter([student, teacher, tied, base, adapter_view, base_view, elsewhere])

            def buffers(self):
                return iter([buffer])

        class Optimizer:
            param_groups = [{"params": [student, base, adapter_view, elsewhere]}]
            state = {}

        watch = self.hook.roles.RoleWatch(self.fake_torch())
        model, optimizer = Model(), Optimizer()
        watch.models.add(model)
        watch.optimizers.add(optimizer)
        watch.after_step()
        roles = watch.of(0)
        self.assertEqual(roles["parameters"], 4096 + 8192 + 2048 + 16384 + 512)
        self.assertEqual(roles["trained"], 4096 + 16384)
        self.assertEqual(roles["frozen"], 8192 + 2048)
        self.assertEqual((watch.of(1)["trained"], watch.of(1)["frozen"]), (1024, 0))
        # With no optimizer (inference) nothing is trained, and nothing is said frozen.
        bare = self.hook.roles.RoleWatch(self.fake_torch())
        bare.models.add(model)
        self.assertEqual((bare.of(0)["trained"], bare.of(0)["frozen"]), (0, 0))

    def ema_world(self):
        """A fake torch with nn.Module, a trained model (4096 bytes) and its optimizer,
        a RoleWatch watching them, and a maker of modules."""
        S, T = self.Storage, self.Tensor
        Module = type("Module", (), {})
        torch = self.fake_torch()
        torch.nn = type("nn", (), {"Module": Module})

        def module(weights, buffers=(), base=Module):
            return type("Net", (base,), {"parameters": lambda self: iter(weights),
                                         "buffers": lambda self: iter(buffers)})()

        weight = T(S(0x1000, 4096), grad=T(S(0x9000, 4096)))
        model = module([weight])

        class Optimizer:
            param_groups = [{"params": [weight]}]
            state = {}

        watch = self.hook.roles.RoleWatch(torch)
        optimizer = Optimizer()
        watch.models.add(model)
        watch.optimizers.add(optimizer)
        return watch, module, Module, (model, optimizer)

    def test_models_a_scripts_globals_hold_count_as_frozen_parameters(self):
        # An EMA of the weights (torch's AveragedModel: updated after each step, never
        # called in training, so no forward finds it) was "activations and other" (109 MiB
        # of convnextema's 8.5 GiB), which also swelled what half the batch would give
        # back. Models a script names (or one level into an object: a module's `.module`,
        # diffusers' EMAModel `shadow_params`) are parameters, frozen.
        S, T = self.Storage, self.Tensor
        watch, module, Module, held = self.ema_world()

        class EmaHolder:  # holds its copy in `.module`
            def __init__(self):
                self.module = module([T(S(0x3000, 1024))])

        class DiffusersEma:  # diffusers' EMAModel: a list of tensors
            def __init__(self):
                self.shadow_params = [T(S(0x5000, 256)), T(S(0x6000, 256), device=None)]

        touched = []

        class Lazy:  # read without its __getattr__
            __slots__ = ()

            def __getattr__(self, name):
                touched.append(name)
                raise AttributeError(name)

        class Proxy:  # its attribute reads run its code: not looked into
            def __getattribute__(self, name):
                touched.append(name)
                return object.__getattribute__(self, name)

        script = ("averaged = module([T(S(0x2000, 4096))], buffers=[T(S(0x2800, 8))])\n"
                  "holder, diffusers_ema, lazy, proxy, same = EmaHolder(), DiffusersEma(), Lazy(), Proxy(), model\n"
                  "watch.after_step()\n"
                  "out.append(watch.of(0))\n"
                  "out.append(watch.at_oom(0))\n")

        def run_script(out):
            exec(script, dict(module=module, T=T, S=S, EmaHolder=EmaHolder, DiffusersEma=DiffusersEma,
                              Lazy=Lazy, Proxy=Proxy, model=held[0], watch=watch, out=out))

        for run in (run_script,
                    # A loop on a thread of its own: that thread's frames are read.
                    lambda out: (lambda t: (t.start(), t.join()))(threading.Thread(target=run_script, args=(out,)))):
            out = []
            watch.at_step, watch.wanted = None, True
            run(out)
            for roles in out:
                self.assertEqual(roles["parameters"], 4096 + 4096 + 8 + 1024 + 256)
                self.assertEqual((roles["trained"], roles["frozen"]), (4096, 4096 + 1024 + 256))
        self.assertEqual(touched, [])
        # Out of the script, no frame names them: the parameters are the model's again.
        self.assertEqual(watch.at_oom(0)["parameters"], 4096)

    def test_a_functions_locals_are_read_only_where_python_copies_none(self):
        # Before Python 3.13, reading a function frame's f_locals stores a copy on the
        # frame, which kept a step's rebound locals (its logits, its batch) alive until the
        # next read: those frames are not read there. From 3.13 (PEP 667) they are.
        S, T = self.Storage, self.Tensor
        watch, module, Module, held = self.ema_world()

        class Logits:
            pass

        def training_loop():
            averaged = module([T(S(0x2000, 4096))])
            logits = Logits()
            freed = weakref.ref(logits)
            watch.at_step, watch.wanted = None, True
            watch.after_step()
            logits = None
            self.assertIsNone(freed(), "the hook's read kept a rebound local alive")
            roles = watch.at_oom(0)
            del averaged
            return roles, logits

        roles, _ = training_loop()
        read = sys.version_info >= (3, 13)
        self.assertEqual(roles["parameters"], 4096 + (4096 if read else 0))

    def test_every_averaged_model_made_counts_wherever_it_is_held(self):
        # torch's AveragedModel (torchvision's ExponentialMovingAverage, Lightning's weight
        # averaging) is noted as it is made: found on any Python, in any frame or none.
        import types

        S, T = self.Storage, self.Tensor
        watch, module, Module, held = self.ema_world()

        class AveragedModel(Module):
            def __init__(self, weights):
                self.weights = weights

            def parameters(self):
                return iter(self.weights)

            def buffers(self):
                return iter([])

        swa = types.ModuleType("torch.optim.swa_utils")
        swa.AveragedModel = AveragedModel
        before = sys.modules.get("torch.optim.swa_utils")
        sys.modules["torch.optim.swa_utils"] = swa
        try:
            self.assertTrue(watch.watch_averaged())
            self.assertFalse(watch.watch_averaged())  # wrapped once
        finally:
            if before is None:
                del sys.modules["torch.optim.swa_utils"]
            else:
                sys.modules["torch.optim.swa_utils"] = before
        kept = {"ema": AveragedModel([T(S(0x2000, 2048))])}  # inside a dict: no frame names it
        watch.at_step, watch.wanted = None, True
        watch.after_step()
        self.assertEqual(watch.of(0)["frozen"], 2048)
        del kept["ema"]
        self.assertEqual(watch.at_oom(0)["parameters"], 4096)

    def test_fsdp2s_sharded_tensors_count_by_their_local_shards(self):
        # FSDP2 (fully_shard) makes parameters, their gradients and AdamW's state DTensors:
        # wrappers with no storage of their own, the memory in `_local_tensor`. Left out,
        # an FSDP2 job on two H200s read "optimizer state 0 B" and "activations and
        # other" 97 % of live.
        S, T = self.Storage, self.Tensor

        class DTensor(T):
            def __init__(self, local):
                super().__init__(S(0, 0), grad=None)
                self._local_tensor = local

            def untyped_storage(self):
                raise RuntimeError("Cannot access storage of DTensor")

        weight = DTensor(T(S(0x1000, 2048)))
        weight.grad = DTensor(T(S(0x9000, 2048)))
        unsharded = T(S(0x5000, 4096))  # the block's all-gathered parameters, in its forward

        class Model:
            def parameters(self):
                return iter([unsharded])

            def buffers(self):
                return iter([])

        class Optimizer:
            param_groups = [{"params": [weight]}]
            state = {weight: {"exp_avg": DTensor(T(S(0xB000, 2048))), "exp_avg_sq": DTensor(T(S(0xC000, 2048)))}}

        watch = self.hook.roles.RoleWatch(self.fake_torch())
        model, optimizer = Model(), Optimizer()  # held: the watch's sets are weak
        watch.models.add(model)
        watch.optimizers.add(optimizer)
        watch.after_step()
        roles = watch.of(0)
        self.assertEqual(roles["parameters"], 2048 + 4096)
        self.assertEqual(roles["gradients"], 2048)
        self.assertEqual(roles["optimizer_state"], 2 * 2048)

    def test_without_an_optimizer_parameters_are_read_at_the_state_and_no_gradient(self):
        S, T = self.Storage, self.Tensor
        weight = T(S(0x1000, 4096), grad=T(S(0x9000, 4096)))
        watch = self.hook.roles.RoleWatch(self.fake_torch())
        model = self.model_of(weight)
        watch.models.add(model)
        roles = watch.of(0)
        self.assertEqual((roles["parameters"], roles["gradients"]), (4096, 0))

    def test_nothing_known_is_none_and_a_failed_read_is_none(self):
        watch = self.hook.roles.RoleWatch(self.fake_torch())
        self.assertIsNone(watch.of(0))

        class Broken:
            def parameters(self):
                raise RuntimeError("changed while read")

        broken = Broken()
        watch.models.add(broken)
        self.assertIsNone(watch.of(0))

    def test_first_pass_is_told_only_inside_the_first_forward_or_its_backward(self):
        S, T = self.Storage, self.Tensor
        watch = self.hook.roles.RoleWatch(self.fake_torch())
        model = self.model_of(T(S(0x1000, 4096)))  # held: the watch holds its models weakly
        watch.models.add(model)
        watch.watch_until = __import__("time").monotonic() + 60
        watch.local.depth = 1  # inside the first pass's forward
        self.assertTrue(watch.at_oom(0).get("first_pass"))
        # On the job's thread outside any forward (the optimizer's update, the next batch
        # copied in): a step may have ended there, so it is not told.
        self.assertNotIn("first_pass", watch.at_oom(0))

    @staticmethod
    def global_hooks_module():
        """A torch.nn.modules.module whose global forward hooks go in `hooks` (pre, post)."""
        import types

        hooks = {"pre": [], "post": []}

        class Handle:
            def __init__(self, kind, fn):
                self.kind, self.fn = kind, fn

            def remove(self):
                hooks[self.kind].remove(self.fn)

        fake = types.ModuleType("torch.nn.modules.module")
        fake.register_module_forward_pre_hook = lambda fn: (hooks["pre"].append(fn), Handle("pre", fn))[1]
        fake.register_module_forward_hook = lambda fn: (hooks["post"].append(fn), Handle("post", fn))[1]
        return fake, hooks

    def test_roots_are_noted_until_one_comes_round_again_then_the_hooks_go(self):
        import sys

        fake, hooks = self.global_hooks_module()
        saved = sys.modules.get("torch.nn.modules.module")
        sys.modules["torch.nn.modules.module"] = fake
        try:
            watch = self.hook.roles.RoleWatch(self.fake_torch())
            self.assertTrue(watch.watch_models())
        finally:
            if saved is None:
                del sys.modules["torch.nn.modules.module"]
            else:
                sys.modules["torch.nn.modules.module"] = saved

        class Module:
            pass

        def forward(module, inner=()):  # what Module.__call__ does with global hooks
            for fn in list(hooks["pre"]):
                fn(module, ())
            for child in inner:
                forward(child)
            for fn in list(hooks["post"]):
                fn(module, (), None)

        gen, disc, layer = Module(), Module(), Module()
        self.assertFalse(watch.in_first_pass())  # no forward yet: nothing known
        forward(gen, [layer])  # step 1: two root models, one inner layer
        forward(disc)
        self.assertEqual(set(watch.models), {gen, disc})
        self.assertEqual(len(hooks["pre"]), 1)
        # An OOM now comes in the job's first pass: no step has ended...
        self.assertTrue(watch.in_first_pass())
        # ...unless the watch has run out (a first step longer than MODELS_WATCH_S).
        until = watch.watch_until
        watch.watch_until = until - 2 * watch.MODELS_WATCH_S
        self.assertFalse(watch.in_first_pass())
        watch.watch_until = until
        import warnings

        # While they live, torch.compile's warning about global hooks (ours) is ignored...
        self.assertIs(warnings.filters[0], watch.warning_filter)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("error")  # as under -W error, put before ours...
            warnings.filters.insert(0, watch.warning_filter)  # ...ours still first
            warnings.warn("Using `torch.compile(module)` when there are global hooks on modules (e.g.)", UserWarning)
        self.assertEqual(seen, [])
        forward(gen, [layer])  # step 2: a root again: every model is known, hooks removed
        self.assertEqual(hooks, {"pre": [], "post": []})
        self.assertFalse(watch.in_first_pass())  # a pass has ended
        self.assertEqual(set(watch.models), {gen, disc})
        # ...and the filter goes with them.
        self.assertNotIn(watch.warning_filter, warnings.filters)
        self.assertFalse(any(f[1] is not None and "global hooks" in f[1].pattern for f in warnings.filters))

    @staticmethod
    def restore_modules(saved):
        """Put back the sys.modules entries a test swapped (None: there was none)."""
        import sys

        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module

    def test_the_global_hooks_stay_idle_where_dynamo_compiled_a_graph(self):
        import sys
        import types

        fake, hooks = self.global_hooks_module()
        dynamo = types.ModuleType("torch._dynamo.utils")
        dynamo.counters = {"stats": {"unique_graphs": 2}}  # torch.compile ran
        saved = {name: sys.modules.get(name) for name in ("torch.nn.modules.module", "torch._dynamo.utils")}
        sys.modules["torch.nn.modules.module"] = fake
        sys.modules["torch._dynamo.utils"] = dynamo
        try:
            watch = self.hook.roles.RoleWatch(self.fake_torch())
            self.assertTrue(watch.watch_models())

            class Module:
                pass

            def forward(module):
                for fn in list(hooks["pre"]):
                    fn(module, ())
                for fn in list(hooks["post"]):
                    fn(module, (), None)

            model, other = Module(), Module()
            model._compiled_call_impl = object()  # Module.compile()
            forward(model)
            forward(model)  # came round: done watching, but Dynamo guards on the hooks
            self.assertTrue(watch.came_round and watch.idle)
            self.assertEqual((len(hooks["pre"]), len(hooks["post"])), (1, 1))
            forward(other)  # idle: nothing noted
            self.assertEqual(set(watch.models), {model})
            model._compiled_call_impl = None  # no model compiled (a loss function was): they go
            watch.stop_watching()
            self.assertEqual(hooks, {"pre": [], "post": []})
        finally:
            self.restore_modules(saved)
            watch.stop_watching()

    def test_a_module_compiled_in_place_keeps_the_global_hooks_idle(self):
        """Module.compile()'s calls are traced, so the root pre-hook never notes that model;
        an eager root (a loss module) coming round must not take the hooks out from under
        its compiled graph (one recompile of a GPT-2 on the H200 before this)."""
        import sys
        import types

        fake, hooks = self.global_hooks_module()

        class Module:
            def __init__(self, params=()):
                self.params = list(params)

            def parameters(self):
                return iter(self.params)

            def compile(self, *args, **kwargs):
                self._compiled_call_impl = object()

        fake.Module = Module
        dynamo = types.ModuleType("torch._dynamo.utils")
        dynamo.counters = {"stats": {"unique_graphs": 1}}
        saved = {name: sys.modules.get(name) for name in ("torch.nn.modules.module", "torch._dynamo.utils")}
        sys.modules["torch.nn.modules.module"] = fake
        sys.modules["torch._dynamo.utils"] = dynamo
        roles = self.hook.roles
        watch = None
        try:
            watch = roles.RoleWatch(self.fake_torch())
            self.assertTrue(watch.watch_models())
            self.assertIsNotNone(getattr(Module.compile, "_vramtop_original", None))
            model, loss = Module(params=[object()]), Module()
            model.compile(dynamic=True)  # the wrapper passes its arguments on
            self.assertIsNotNone(model._compiled_call_impl)

            def eager(module):
                for fn in list(hooks["pre"]):
                    fn(module, ())
                for fn in list(hooks["post"]):
                    fn(module, (), None)

            eager(loss)
            eager(loss)  # came round; the compiled model was never noted
            self.assertEqual(set(watch.models), {loss})
            self.assertTrue(watch.came_round and watch.idle)
            self.assertEqual((len(hooks["pre"]), len(hooks["post"])), (1, 1))
            # Only a module without parameters compiled in place (a loss or metric
            # module): the hooks go, as where a loss function alone is compiled.
            roles.COMPILED_IN_PLACE.clear()
            metric = Module()
            metric.compile()
            self.assertEqual(set(roles.COMPILED_IN_PLACE), {metric})
            watch.idle = False
            watch.stop_watching()
            self.assertEqual(hooks, {"pre": [], "post": []})
            # A second watch (a forked child's) does not wrap the wrapper.
            wrapped = Module.compile
            second = roles.RoleWatch(self.fake_torch())
            second.watch_models()
            second.stop_watching()
            self.assertIs(Module.compile, wrapped)
        finally:
            self.restore_modules(saved)
            roles.COMPILED_IN_PLACE.clear()
            if watch is not None:
                watch.idle = False
                watch.stop_watching()

    def passes_world(self):
        """A fake torch whose autograd engine runs the callbacks queued in a backward at its
        end, and a Model whose own hooks run as Module.__call__ runs them."""
        import collections

        queued = []

        class Engine:
            def queue_callback(self, fn):
                queued.append(fn)

        class Grad:
            def __init__(self):
                self._version = 0

            def zero_(self):
                self._version += 1

        class Node:  # a grad_fn: its prehooks run as a backward reaches it
            def __init__(self, model):
                self.hooks, self.model = [], model

            def register_prehook(self, fn):
                self.hooks.append(fn)

            def backward(self, gives=True, ddp=False):
                for fn in self.hooks:
                    fn(())
                if gives:  # AccumulateGrad: made, or added to in place
                    w = self.model.weight
                    if w.grad is None:
                        w.grad = Grad()
                    else:
                        w.grad._version += 1
                if ddp:  # DDP's reducer: the reduced gradient copied back in place, queued last
                    queued.append(lambda: setattr(self.model.weight.grad, "_version", self.model.weight.grad._version + 1))
                while queued:
                    queued.pop(0)()

        class Param:
            requires_grad, grad = True, None

        class Handle:
            def __init__(self, hooks, fn):
                self.hooks, self.fn = hooks, fn

            def remove(self):
                self.hooks.remove(self.fn)

        class Model:
            training = True

            def __init__(self):
                self.weight, self.pre, self.post = Param(), [], []

            def parameters(self):
                return iter([self.weight])

            def register_forward_pre_hook(self, fn):
                self.pre.append(fn)
                return Handle(self.pre, fn)

            def register_forward_hook(self, fn):
                self.post.append(fn)
                return Handle(self.post, fn)

            def __call__(self):  # what Module.__call__ does with its own hooks
                for fn in list(self.pre):
                    fn(self, ())
                out = type("Out", (), {"grad_fn": Node(self)})()
                for fn in list(self.post):
                    fn(self, (), {"loss": out, "logits": [out]})
                return out

        grad_on = [True]
        autograd = type("Autograd", (), {"Variable": type("Variable", (), {"_execution_engine": Engine()})})
        torch = type("Torch", (), {"is_tensor": staticmethod(lambda t: hasattr(t, "grad_fn")),
                                   "is_grad_enabled": staticmethod(lambda: grad_on[0]),
                                   "autograd": autograd})()
        marks, steps = collections.deque(), []
        passes = self.hook.roles.PassMarks(torch, marks, lambda: bool(steps))
        return passes, marks, steps, Model, grad_on

    def test_passes_mark_a_step_only_after_a_backward_with_the_gradients_released(self):
        passes, marks, steps, Model, _ = self.passes_world()
        frozen, model = Model(), Model()
        frozen.weight.requires_grad = False  # a frozen encoder run first: not followed
        passes.follow(frozen)
        passes.follow(model)
        passes.follow(Model())  # only the first trained root is followed
        self.assertEqual((len(frozen.pre), len(model.pre)), (0, 1))
        out = model()  # the first pass: nothing before it
        self.assertEqual(len(marks), 0)
        model()  # called again before any backward (a Siamese loss): no step
        self.assertEqual(len(marks), 0)
        out.grad_fn.backward()
        out = model()  # a micro-batch: its gradients kept, untouched, for the next
        self.assertEqual(len(marks), 0)
        self.assertEqual(passes.accumulating(), 1)  # an OOM now: inside the first step
        out.grad_fn.backward()
        model.weight.grad = None  # zero_grad(): the step is over
        out = model()
        self.assertEqual(len(marks), 1)
        self.assertEqual(passes.accumulating(), 0)  # a step has ended since
        model()  # no backward since: no step
        self.assertEqual(len(marks), 1)
        out.grad_fn.backward()
        steps.append(1.0)  # an optimizer step marked at last: its marks say where steps are
        model()
        self.assertEqual(len(marks), 1)
        self.assertEqual((model.pre, model.post), ([], []))

    def test_passes_mark_gradients_zeroed_in_place_and_skip_evaluation(self):
        passes, marks, steps, Model, grad_on = self.passes_world()
        model = Model()
        passes.follow(model)
        out = model()
        out.grad_fn.backward()
        model.weight.grad.zero_()  # a hand-written update zeroing in place: a step ended
        out = model()
        self.assertEqual((len(marks), passes.kept), (1, 0))
        out.grad_fn.backward()
        grad_on[0] = False  # an evaluation pass under no_grad before zero_grad()
        model()
        grad_on[0] = True
        self.assertEqual(len(marks), 1)
        model.weight.grad.zero_()
        model()  # the next training pass still sees the backward
        self.assertEqual(len(marks), 2)

    def test_a_gradient_is_read_after_the_callbacks_the_backward_queued(self):
        passes, marks, steps, Model, _ = self.passes_world()
        model = Model()
        passes.follow(model)
        out = model()
        out.grad_fn.backward(ddp=True)
        out = model()  # DDP's copy came after ours was queued: still untouched since
        self.assertEqual((len(marks), passes.kept), (0, 1))
        out.grad_fn.backward(ddp=True)
        out.grad_fn.backward(ddp=True)  # a second backward of the same forward: read again
        model()
        self.assertEqual((len(marks), passes.kept), (0, 2))

    def test_passes_stop_where_no_parameter_holds_a_gradient_after_the_backward(self):
        passes, marks, steps, Model, _ = self.passes_world()
        model = Model()
        passes.follow(model)
        out = model()
        out.grad_fn.backward(gives=False)  # ZeRO: the gradients go to the engine's own buffers
        model()
        self.assertEqual((len(marks), passes.kept), (0, 0))
        self.assertEqual((model.pre, model.post), ([], []))
