"""The hook in a real job process (job_driver.py under the real bootstrap, stub torch):
hello, states at the viewer's pace, several viewers, slow, vanishing and hostile viewers,
the OOM observer, the excepthook chain, fork safety, history sites, bye."""

import os
import sys
import signal
import socket
import stat
import struct
import time
import unittest

from support import DRIVER, HOOK_DIR, Job, Viewer, wait_for

MiB = 1024 * 1024


def leak_site_line():
    with open(DRIVER) as source:
        for number, line in enumerate(source, 1):
            if "LEAK-SITE" in line:
                return number
    raise AssertionError("no LEAK-SITE marker in job_driver.py")


class LiveTest(unittest.TestCase):
    def setUp(self):
        self.jobs = []

    def tearDown(self):
        for job in self.jobs:
            job.kill()
        Viewer.close_all()

    def job(self, **env):
        job = Job(**env)
        self.jobs.append(job)
        return job

    def ready_job(self, **env):
        """A job that imported torch and initialised CUDA, with one 3 MiB block."""
        job = self.job(**env)
        job.do("import")
        job.wait_socket()
        job.do("init")
        job.do("alloc a %d" % (3 * MiB))
        Viewer(job.socket_path).ready_hello()  # the hook has seen CUDA come up
        return job

    def test_hello_carries_the_launchers_rank(self):
        job = self.job(RANK="3", LOCAL_RANK="1", WORLD_SIZE="4")
        job.do("import")
        job.wait_socket()
        hello = Viewer(job.socket_path).recv()
        self.assertEqual(
            [hello["rank"], hello["local_rank"], hello["world_size"]], [3, 1, 4]
        )
        # A value that is not a whole number is left out rather than guessed.
        odd = self.job(RANK="x", LOCAL_RANK="-1", WORLD_SIZE="")
        odd.do("import")
        odd.wait_socket()
        hello = Viewer(odd.socket_path).recv()
        self.assertEqual(
            [hello["rank"], hello["local_rank"], hello["world_size"]], [None, None, None]
        )

    def test_hello_before_cuda_then_states_only_once_cuda_is_up(self):
        job = self.job()
        job.do("import")
        job.wait_socket()
        viewer = Viewer(job.socket_path)
        hello = viewer.recv()
        self.assertEqual(hello["type"], "hello")
        self.assertEqual(hello["protocol"], 1)
        self.assertEqual(hello["pid"], job.proc.pid)
        self.assertEqual(hello["torch_version"], "2.11.0+stub")
        self.assertFalse(hello["cuda_ready"])
        # No launcher set RANK and friends: null, not 0.
        self.assertEqual(
            [hello["rank"], hello["local_rank"], hello["world_size"]], [None, None, None]
        )
        self.assertEqual(os.stat(job.socket_path).st_mode & 0o777, 0o600)
        viewer.subscribe(0.05)
        viewer.sock.settimeout(0.6)
        with self.assertRaises(socket.timeout):
            viewer.recv()  # no state while CUDA is down
        # The hook itself never initialised CUDA in all that time.
        self.assertEqual(job.do("cuda?"), "ok False")
        viewer.sock.settimeout(5)
        job.do("init")
        again = viewer.recv()
        self.assertEqual(again["type"], "hello")
        self.assertTrue(again["cuda_ready"])
        self.assertIn("oom_observer", again["capabilities"])
        self.assertEqual(viewer.recv_type("state")["type"], "state")

    def test_states_come_at_the_viewers_interval_with_the_allocators_figures(self):
        job = self.ready_job()
        viewer = Viewer(job.socket_path)
        viewer.subscribe(0.1)
        first = viewer.recv_type("state")
        started = time.monotonic()
        states = [first]
        while time.monotonic() - started < 1.0:
            states.append(viewer.recv_type("state"))
        # 1 s at 0.1 s: about 10 more; a hook ignoring the interval would send far more or none.
        self.assertGreaterEqual(len(states), 3)
        self.assertLessEqual(len(states), 14)
        seqs = [s["seq"] for s in states]
        self.assertEqual(seqs, sorted(seqs))
        state = states[-1]
        self.assertEqual(state["stats"]["allocated_bytes"], 3 * MiB)
        self.assertEqual(state["stats"]["reserved_bytes"], 4 * MiB)
        self.assertEqual(sum(s["total_size"] for s in state["segments"]), 4 * MiB)
        blocks = state["segments"][0]["blocks"]
        self.assertEqual([b["state"] for b in blocks], ["active_allocated", "inactive"])
        self.assertIsNone(blocks[0]["site"])  # no history asked for
        self.assertFalse(state["truncated"])
        self.assertIn("expandable_segments", state["settings"])
        self.assertEqual(state["device_uuid"], "5a1e0000-0000-0000-0000-000000000000")
        # The pace changes when the viewer subscribes again.
        viewer.subscribe(3600)
        viewer.recv_type("state")  # one may already be on its way
        viewer.sock.settimeout(0.8)
        with self.assertRaises(socket.timeout):
            viewer.recv_type("state")

    def test_several_viewers_each_at_its_own_pace_and_one_leaving_harms_none(self):
        job = self.ready_job()
        fast, slow, leaver = (Viewer(job.socket_path) for _ in range(3))
        fast.subscribe(0.05)
        slow.subscribe(0.5)
        leaver.subscribe(0.05)
        leaver.recv_type("state")
        leaver.close()
        job.do("alloc b %d" % (8 * MiB))
        fast_count = slow_count = 0
        started = time.monotonic()
        while time.monotonic() - started < 1.2:
            fast.recv_type("state")
            fast_count += 1
        slow.sock.settimeout(0.05)
        try:
            while True:
                slow.recv_type("state")
                slow_count += 1
        except socket.timeout:
            pass
        self.assertGreater(fast_count, 2 * slow_count)
        self.assertGreaterEqual(slow_count, 1)
        self.assertEqual(fast.recv_type("state")["stats"]["allocated_bytes"], 11 * MiB)

    def test_a_viewer_that_never_reads_never_slows_the_job_and_is_dropped(self):
        job = self.ready_job(VRAMTOP_HOOK_STALL_S="1.0")
        for i in range(300):  # big states (~75 KB), so the socket buffer fills at once
            job.do("alloc x%d %d" % (i, 3 * MiB))
        hog = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        hog.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        hog.connect(job.socket_path)
        body = b'{"type":"subscribe","interval_s":0.05}'
        hog.sendall(struct.pack(">I", len(body)) + body)
        # 100 steps of 10 ms: a hook blocked on the hog would stall this (forever).
        elapsed = float(job.do("pace 100").split()[1])
        self.assertLess(elapsed, 5.0)
        # Another viewer is served meanwhile.
        other = Viewer(job.socket_path)
        other.subscribe(0.05)
        self.assertEqual(other.recv_type("state")["type"], "state")
        # After taking nothing for the stall limit, the hog is disconnected. It finds out by
        # writing (reading would make it a slow reader again); each write re-subscribes,
        # which also asks for a state at once, so its buffer fills sooner.
        dropped = False
        deadline = time.monotonic() + 30
        while not dropped and time.monotonic() < deadline:
            try:
                hog.sendall(struct.pack(">I", len(body)) + body)
            except (BrokenPipeError, ConnectionResetError):
                dropped = True
            time.sleep(0.2)
        self.assertTrue(dropped)
        hog.close()

    def test_a_vanishing_viewer_leaves_the_job_and_others_alone(self):
        job = self.ready_job()
        other = Viewer(job.socket_path)
        other.subscribe(0.05)
        for _ in range(5):
            gone = Viewer(job.socket_path)
            gone.subscribe(0.05)
            gone.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            gone.close()  # reset, mid-stream
        job.do("pace 20")
        self.assertEqual(other.recv_type("state")["type"], "state")
        rc, _, err = job.finish()
        self.assertEqual(rc, 0)
        self.assertNotIn("Traceback", err)
        self.assertEqual(err, "")

    def test_garbage_and_huge_frames_drop_only_that_viewer(self):
        job = self.ready_job()
        good = Viewer(job.socket_path)
        good.subscribe(0.05)
        hostile = [
            b"\xff\xff\xff\xff",  # a 4 GiB frame announced
            struct.pack(">I", 1 << 20) + b"x" * 100,  # 1 MiB: over what a viewer may send
            struct.pack(">I", 4) + b"\xff\xfe\xfd\xfc",  # bad UTF-8
            struct.pack(">I", 5) + b"[1,2]",  # not an object
            struct.pack(">I", 3) + b"{]}",  # not JSON
        ]
        for data in hostile:
            bad = Viewer(job.socket_path)
            bad.recv_type("hello")
            bad.send_raw(data)
            self.assertTrue(bad.closed_by_peer(), data[:8])
            bad.close()
        # Unknown types and a subscribe without its field are ignored, not fatal.
        odd = Viewer(job.socket_path)
        odd.send({"type": "what-is-this", "x": 1})
        odd.send({"type": "subscribe"})
        odd.send({"type": "subscribe", "interval_s": "fast"})
        odd.subscribe(0.05)
        self.assertEqual(odd.recv_type("state")["type"], "state")
        self.assertEqual(good.recv_type("state")["type"], "state")
        self.assertEqual(job.do("pace 5")[:2], "ok")

    def test_oom_observer_sends_the_state_before_the_exception_and_keeps_it(self):
        job = self.ready_job()
        job.do("alloc b %d" % (6 * MiB))
        job.do("free b")
        viewer = Viewer(job.socket_path)
        viewer.recv_type("hello")
        self.assertEqual(job.do("oom %d" % (1024 * MiB)), "ok caught OutOfMemoryError")
        oom = viewer.recv_type("oom")
        self.assertEqual(oom["requested_bytes"], 1024 * MiB)
        self.assertEqual(oom["device"], 0)
        self.assertEqual(oom["device_total_bytes"], 8 * 1024 * MiB)
        self.assertEqual(oom["device_free_bytes"], 8 * 1024 * MiB - 10 * MiB)
        self.assertEqual(oom["stats"]["allocated_bytes"], 3 * MiB)
        self.assertEqual(oom["stats"]["reserved_bytes"], 10 * MiB)
        self.assertEqual(oom["stats"]["num_ooms"], 1)
        self.assertEqual(sum(s["total_size"] for s in oom["segments"]), 10 * MiB)
        self.assertIn("Tried to allocate 1024.00 MiB", oom["summary"])
        self.assertIn("3.00 MiB is allocated by PyTorch, and 7.00 MiB is reserved", oom["summary"])
        # A viewer that comes later gets the last OOM right after hello.
        late = Viewer(job.socket_path)
        self.assertEqual(late.recv()["type"], "hello")
        self.assertEqual(late.recv()["type"], "oom")

    def test_an_oom_right_after_cuda_init_is_still_seen(self):
        job = self.job(VRAMTOP_HISTORY="1")
        job.do("import")
        job.wait_socket()
        viewer = Viewer(job.socket_path)
        viewer.recv_type("hello")
        # No pause: the observer and history come with CUDA's init (torch.cuda._lazy_call),
        # not at the hook's next poll.
        job.do("init")
        job.do("alloc early %d" % MiB)
        self.assertEqual(job.do("oom %d" % MiB), "ok caught OutOfMemoryError")
        oom = viewer.recv_type("oom")
        self.assertEqual(oom["requested_bytes"], MiB)
        self.assertEqual(oom["stats"]["allocated_bytes"], MiB)
        self.assertTrue(oom["segments"][0]["blocks"][0]["site"].endswith(":%d alloc_named" % leak_site_line()))

    def test_an_oom_on_the_line_after_import_torch_is_still_caught(self):
        job = self.job()
        self.assertEqual(job.do("rush %d" % MiB), "ok caught")
        job.wait_socket()
        viewer = Viewer(job.socket_path)
        self.assertEqual(viewer.recv()["type"], "hello")
        self.assertEqual(viewer.recv()["requested_bytes"], MiB)  # the kept `oom`

    def test_uncaught_oom_reaches_viewers_and_the_users_excepthook_still_runs(self):
        job = self.job()
        job.do("import")
        job.wait_socket()
        job.do("init")
        viewer = Viewer(job.socket_path)
        viewer.ready_hello()
        job.proc.stdin.write("oom_uncaught %d\n" % (2 * 1024 * MiB))
        job.proc.stdin.flush()
        self.assertEqual(viewer.recv_type("oom")["requested_bytes"], 2 * 1024 * MiB)
        error = viewer.recv_type("error")
        self.assertEqual(error["kind"], "OutOfMemoryError")
        self.assertIn("CUDA out of memory", error["message"])
        bye = viewer.recv_type("bye")
        self.assertEqual(bye["exit_code"], 1)
        rc, _, err = job.finish()
        self.assertEqual(rc, 1)
        # Python's own excepthook (the one we chain to) still printed the traceback.
        self.assertIn("OutOfMemoryError: CUDA out of memory", err)
        self.assertFalse(os.path.exists(job.socket_path))

    def test_the_jobs_own_excepthook_still_runs_after_ours(self):
        job = self.job()
        job.do("userhook")
        job.do("import")
        job.wait_socket()
        job.do("init")
        viewer = Viewer(job.socket_path)
        viewer.ready_hello()
        job.proc.stdin.write("oom_uncaught %d\n" % MiB)
        job.proc.stdin.flush()
        self.assertEqual(viewer.recv_type("error")["kind"], "OutOfMemoryError")
        rc, _, err = job.finish()
        self.assertEqual(rc, 1)
        # Ours: only the line saying where the OOM's state was kept (test_oom_keep.py).
        theirs = [l for l in err.splitlines() if not l.startswith("vramtop: OOM 1: allocator state kept in ")]
        self.assertEqual(theirs, ["USER HOOK saw OutOfMemoryError"])

    def test_thread_excepthook_is_chained_too(self):
        job = self.ready_job()
        viewer = Viewer(job.socket_path)
        viewer.recv_type("hello")
        job.do("oom_in_thread %d" % MiB)
        error = viewer.recv_type("error")
        self.assertEqual(error["kind"], "OutOfMemoryError")
        rc, _, err = job.finish()
        self.assertEqual(rc, 0)
        self.assertIn("Exception in thread", err)  # threading's own hook ran after ours

    def test_bye_at_a_normal_exit_and_the_socket_is_removed(self):
        job = self.ready_job()
        viewer = Viewer(job.socket_path)
        viewer.subscribe(0.05)
        viewer.recv_type("state")
        job.proc.stdin.write("exit 3\n")
        job.proc.stdin.flush()
        self.assertEqual(viewer.recv_type("bye")["type"], "bye")
        rc, out, _ = job.finish()
        self.assertEqual(rc, 3)
        self.assertFalse(os.path.exists(job.socket_path))

    def test_history_names_the_users_line(self):
        job = self.job(VRAMTOP_HISTORY="1")
        job.do("import")
        job.wait_socket()
        job.do("init")
        viewer = Viewer(job.socket_path)
        hello = wait_for(lambda: viewer.recv_type("hello")["history"], timeout=5)
        self.assertTrue(hello)
        # What reading stacks imports came in on the job's thread, at its CUDA init: never
        # on the hook's, where it raced the job's own imports.
        self.assertEqual(job.do("inductor?"), "ok MainThread")
        job.do("alloc leak %d" % (2 * MiB))
        # Stacks for live blocks only, on top of the event ring (no stacks in the ring).
        calls = job.do("history")
        self.assertIn("{'enabled': 'all', 'context': 'state', 'stacks': 'python', 'max_entries': 32768, "
                      "'skip_actions': ['free_requested']}", calls)
        viewer.subscribe(0.05)
        state = viewer.recv_type("state")
        sites = [b["site"] for s in state["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
        expected = "%s:%d alloc_named" % (DRIVER, leak_site_line())
        self.assertEqual(sites, [expected])

    def test_a_full_ring_is_restarted_from_a_checkpoint_and_history_keeps_its_stacks(self):
        job = self.job(VRAMTOP_HISTORY="1", VRAMTOP_RING="6")
        job.do("import")
        job.wait_socket()
        job.do("init")
        viewer = Viewer(job.socket_path)
        self.assertEqual(wait_for(lambda: viewer.recv_type("hello")["ring"], timeout=5), 6)
        for n in range(4):  # 8 entries at once: the ring is full and wrapped
            job.do("alloc t%d %d" % (n, MiB))
        viewer.subscribe(0.05)
        viewer.recv_type("state")
        # Checkpointed: cleared in place, still with stacks for live blocks.
        calls = wait_for(lambda: (lambda c: c if "'clear_history': True" in c else None)(job.do("history")))
        self.assertIn("{'enabled': 'all', 'context': 'state', 'stacks': 'python', 'max_entries': 6, 'clear_history': True, "
                      "'skip_actions': ['free_requested']}", calls)
        self.assertNotIn("'enabled': 'state'", calls)  # never shrunk in place (PyTorch would crash)
        for n in range(4):  # the stub exits 139 where PyTorch would write past a shrunk ring
            job.do("alloc later%d %d" % (n, MiB))
        state = wait_for(lambda: (lambda s: s if len(s["segments"]) == 8 else None)(viewer.recv_type("state")))
        sites = [b["site"] for s in state["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
        self.assertTrue(all(site and "alloc_named" in site for site in sites), sites)

    def test_a_ring_the_allocations_may_fill_is_checkpointed_with_no_viewer(self):
        # Cleared in place where PyTorch takes clear_history (one call), else off (which
        # clears it) and at once on again: either way the ring goes on from a checkpoint.
        # Without free_requested (skip_actions), 2 entries an allocation, else 3.
        ring = "{'enabled': 'all', 'context': None, 'stacks': 'python', 'max_entries': 25"
        skip = ", 'skip_actions': ['free_requested']"
        cleared = ring + ", 'clear_history': True%s}]"
        off_and_on = "'max_entries': %d}, %s%%s}]" % (sys.maxsize, ring)
        for lacks, clue, ends, quarter in (
            ("", "'clear_history': True", cleared % skip, 4),
            ("skip_actions", "'clear_history': True", cleared % "", 3),
            ("clear_history", "'enabled': None", off_and_on % skip, 4),
            ("clear_history,skip_actions", "'enabled': None", off_and_on % "", 3),
        ):
            with self.subTest(lacks=lacks):
                job = self.job(VRAMTOP_RING="25", STUB_TORCH_LACKS=lacks)
                job.do("import")
                job.wait_socket()
                job.do("init")
                job.do("alloc a %d" % MiB)
                job.do("alloc b %d" % MiB)  # 2 allocations: 6 entries at most, under a quarter of 25
                time.sleep(1.0)
                self.assertNotIn(clue, job.do("history"))
                if quarter == 4:  # 2 entries each: 3 allocations are 6, still under a quarter
                    job.do("alloc c %d" % MiB)
                    time.sleep(1.0)
                    self.assertNotIn(clue, job.do("history"))
                for n in range(quarter - 2 - (quarter == 4)):  # then it may be a quarter full
                    job.do("alloc d%d %d" % (n, MiB))
                calls = wait_for(lambda: (lambda c: c if clue in c else None)(job.do("history")), timeout=5)
                self.assertTrue(calls.endswith(ends), calls)
                self.assertEqual(job.do("traces"), "ok 0")

    def test_the_jobs_own_history_is_never_turned_off_by_the_hook(self):
        job = self.job(VRAMTOP_HISTORY="1", VRAMTOP_RING="6")
        job.do("import")
        job.wait_socket()
        job.do("init")
        job.do("user_history")
        viewer = Viewer(job.socket_path)
        viewer.subscribe(0.05)
        for n in range(4):  # past the ring's 6 entries: the hook would turn it off
            job.do("alloc t%d %d" % (n, MiB))
        for _ in range(10):
            viewer.recv_type("state")
        time.sleep(2.5)  # HistoryDuty's periods and the ring's checks go by
        calls = job.do("history")
        last = calls[calls.rindex("{"):]
        self.assertEqual(last, "{'enabled': 'all', 'context': 'all', 'stacks': 'all', 'max_entries': 100000}]", calls)
        self.assertEqual(job.do("oom %d" % (1024 * MiB)), "ok caught OutOfMemoryError")

    def test_a_hook_started_late_leaves_history_the_job_already_records(self):
        job = self.job(VRAMTOP_HOOK="0")  # no bootstrap: started by hand, as in a notebook
        job.do("import")
        job.do("init")
        job.do("user_history")
        job.do("alloc a %d" % MiB)
        job.do("start")
        job.wait_socket()
        viewer = Viewer(job.socket_path)
        hello = wait_for(lambda: (lambda h: h if h["cuda_ready"] else None)(viewer.recv_type("hello")))
        self.assertEqual(hello["ring"], 0)
        calls = job.do("history")
        self.assertNotIn("'max_entries': 32768", calls)

    def test_an_older_torch_is_served_with_what_it_has_and_told_once(self):
        job = self.job(STUB_TORCH_LACKS="oom_observer,allocator_settings,record_memory_history",
                       VRAMTOP_HISTORY="1")
        job.do("import")
        job.wait_socket()
        job.do("init")
        viewer = Viewer(job.socket_path)
        hello = wait_for(lambda: (lambda h: h if h["cuda_ready"] else None)(viewer.recv_type("hello")))
        self.assertNotIn("oom_observer", hello["capabilities"])
        self.assertFalse(hello["history"])
        self.assertTrue(any("OOM" in m for m in hello["missing"]))
        viewer.subscribe(0.05)
        self.assertEqual(viewer.recv_type("state")["stats"]["allocated_bytes"], 0)
        job.do("oom %d" % MiB)  # no observer: the job still gets its own exception
        rc, _, err = job.finish()
        self.assertEqual(rc, 0)
        lines = [line for line in err.splitlines() if line.startswith("vramtop hook:")]
        self.assertEqual(len(lines), 1, err)
        self.assertIn("_cuda_attach_out_of_memory_observer", lines[0])

    def untracked_job(self, **env):
        """A job under another allocator than PyTorch's own, with one 3 MiB block: the job,
        a viewer, and the hello once CUDA is up."""
        job = self.job(**env)
        job.do("import")
        job.wait_socket()
        job.do("init")
        job.do("alloc a %d" % (3 * MiB))
        viewer = Viewer(job.socket_path)
        hello = wait_for(lambda: (lambda h: h if h["cuda_ready"] else None)(viewer.recv_type("hello")))
        return job, viewer, hello

    def test_a_job_under_cuda_malloc_async_gets_its_totals_and_one_line_saying_why_no_more(self):
        job, viewer, hello = self.untracked_job(PYTORCH_CUDA_ALLOC_CONF="backend:cudaMallocAsync",
                                                VRAMTOP_HISTORY="1")
        self.assertEqual(hello["allocator_backend"], "cudaMallocAsync")
        self.assertNotIn("oom_observer", hello["capabilities"])
        self.assertNotIn("event_ring", hello["capabilities"])
        self.assertEqual(hello["ring"], 0)
        self.assertFalse(hello["history"])
        self.assertEqual(len([m for m in hello["missing"] if "cudaMallocAsync" in m]), 1, hello["missing"])
        # States keep coming, with PyTorch's totals and no segments (it refuses snapshots).
        viewer.subscribe(0.05)
        state = viewer.recv_type("state")
        self.assertEqual(state["stats"]["allocated_bytes"], 3 * MiB)
        self.assertEqual(state["segments"], [])
        self.assertEqual(job.do("oom %d" % MiB), "ok caught OutOfMemoryError")
        rc, _, err = job.finish()
        self.assertEqual(rc, 0)
        # Nothing of ours in the job's output (the viewer says why there is no more): not
        # PyTorch's refusals of each call, nor a failed read.
        self.assertNotIn("vramtop hook:", err)
        self.assertNotIn("RuntimeError", err)

    def test_a_pluggable_allocator_refusing_even_its_stats_still_gets_states(self):
        job, viewer, hello = self.untracked_job(STUB_TORCH_BACKEND="pluggable")
        self.assertEqual(hello["allocator_backend"], "pluggable")
        self.assertTrue(any(m.startswith("backend:pluggable:") for m in hello["missing"]), hello["missing"])
        viewer.subscribe(0.05)
        state = viewer.recv_type("state")
        self.assertIsNone(state["stats"]["allocated_bytes"])  # refused, not 0
        self.assertEqual(state["segments"], [])
        rc, _, err = job.finish()
        self.assertEqual(rc, 0)
        self.assertNotIn("reading the allocator failed", err)

    def test_the_socket_appears_only_when_it_accepts_and_stale_ones_are_replaced(self):
        for _ in range(5):
            job = self.job()
            # Left by an earlier process with this pid: a socket path and a half-made one.
            for name in ("vramtop-%d.sock" % job.proc.pid, ".vt-%d.new" % job.proc.pid):
                with open(os.path.join(job.dir, name), "w"):
                    pass
            job.do("import")
            # Connect the moment the (new) socket is there: never refused.
            def is_socket():
                try:
                    return stat.S_ISSOCK(os.stat(job.socket_path).st_mode)
                except FileNotFoundError:  # the stale one removed, the new one not yet there
                    return False
            self.assertTrue(wait_for(is_socket, timeout=10, step=0.001))
            viewer = Viewer(job.socket_path)
            self.assertEqual(viewer.recv_type("hello")["type"], "hello")
            self.assertEqual(sorted(os.listdir(job.dir)), ["vramtop-%d.sock" % job.proc.pid])
            job.finish()

    def test_an_open_socket_directory_is_refused_in_one_line_and_the_job_runs(self):
        job = self.job()
        os.chmod(job.dir, 0o755)
        job.do("import")
        job.do("init")
        job.do("pace 30")
        self.assertFalse(os.path.exists(job.socket_path))
        rc, _, err = job.finish()
        self.assertEqual(rc, 0)
        self.assertEqual(err.count("vramtop hook:"), 1)
        self.assertIn("chmod 700", err)


class ForkTest(unittest.TestCase):
    def test_a_forked_child_keeps_its_hands_off_the_parents_socket(self):
        # Real torch refuses CUDA in a forked child; the stub allows it when asked to.
        job = Job(STUB_TORCH_CHILD_CUDA="1", CHILD_LIFE_S="15")
        try:
            job.do("import")
            job.wait_socket()
            job.do("init")
            viewer = Viewer(job.socket_path)
            viewer.subscribe(0.05)
            viewer.recv_type("state")
            # The child exits through sys.exit: its atexit must not remove our socket.
            child = int(job.do("fork plain").split()[1])
            time.sleep(0.3)
            self.assertTrue(os.path.exists(job.socket_path))
            self.assertFalse(os.path.exists(os.path.join(job.dir, "vramtop-%d.sock" % child)))
            self.assertEqual(viewer.recv_type("state")["type"], "state")
            viewer.close()
            # A child that starts using CUDA itself gets a server of its own.
            child = int(job.do("fork cuda").split()[1])
            child_path = os.path.join(job.dir, "vramtop-%d.sock" % child)
            self.assertTrue(wait_for(lambda: os.path.exists(child_path), timeout=5))
            mine = Viewer(child_path)
            hello = mine.recv_type("hello")
            self.assertEqual(hello["pid"], child)
            self.assertEqual(hello["ppid"], job.proc.pid)
            mine.subscribe(0.05)
            # Its own allocation shows within a few states (the first may predate it).
            held = [mine.recv_type("state")["stats"]["allocated_bytes"]]
            while held[-1] != 4 * MiB and len(held) < 40:
                held.append(mine.recv_type("state")["stats"]["allocated_bytes"])
            self.assertEqual(held[-1], 4 * MiB)
            # The parent's viewers still see the parent.
            again = Viewer(job.socket_path)
            self.assertEqual(again.recv_type("hello")["pid"], job.proc.pid)
            os.kill(child, signal.SIGKILL)
        finally:
            job.kill()
            Viewer.close_all()

    def test_a_spawned_child_serves_only_once_it_uses_cuda(self):
        # A DataLoader's workers under spawn import torch and never touch CUDA: not a job
        # a viewer should list. mp.spawn's ranks do use it, and are served.
        job = Job(CHILD_LIFE_S="20")
        try:
            job.do("import")
            job.wait_socket()
            plain = int(job.do("spawn plain").split()[1])
            user = int(job.do("spawn cuda").split()[1])
            user_path = os.path.join(job.dir, "vramtop-%d.sock" % user)
            self.assertTrue(wait_for(lambda: os.path.exists(user_path), timeout=10))
            self.assertEqual(Viewer(user_path).recv_type("hello")["pid"], user)
            # The plain child started first and has had as long: it is alive, unlisted.
            os.kill(plain, 0)
            self.assertFalse(os.path.exists(os.path.join(job.dir, "vramtop-%d.sock" % plain)))
        finally:
            job.kill()
            Viewer.close_all()


class StartedByMultiprocessingTest(unittest.TestCase):
    def test_spawn_and_forkserver_children_are_told_from_a_users_command(self):
        if HOOK_DIR not in sys.path:
            sys.path.insert(0, HOOK_DIR)
        from vramtop_hook.server import started_by_multiprocessing

        spawned = ["/usr/bin/python3", "-c", "from multiprocessing.spawn import spawn_main; "
                   "spawn_main(tracker_fd=5, pipe_handle=7)", "--multiprocessing-fork"]
        self.assertTrue(started_by_multiprocessing(spawned))
        self.assertTrue(started_by_multiprocessing(["-c", "--multiprocessing-fork"]))  # 3.9's sys.argv
        self.assertTrue(started_by_multiprocessing(
            ["python3", "-c", "from multiprocessing.forkserver import main; main(3, 4, ['__main__'])"]))
        self.assertFalse(started_by_multiprocessing(["python3", "train.py", "--lr", "1e-4"]))
        self.assertFalse(started_by_multiprocessing(["torchrun", "--nproc-per-node", "2", "train.py"]))


if __name__ == "__main__":
    unittest.main()
