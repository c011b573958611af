"""The hook's history in pieces (hook 1.5) and the job's own step marks, in this process."""

import collections
import os
import pickle
import sys
import unittest
import zlib

from support import HOOK_DIR, KeptFilesTest

if HOOK_DIR not in sys.path:
    sys.path.insert(0, HOOK_DIR)
import vramtop_hook  # noqa: E402


class HistoryTest(unittest.TestCase):
    def test_pieces_are_kept_as_read_then_compressed(self):
        h = vramtop_hook.history.History(limit=1 << 20)
        h.add(b"events" * 100, b"state")
        kept = h.of()
        self.assertTrue(kept["from_start"])
        self.assertEqual([p["kind"] for p in kept["pieces"]], ["events", "state"])
        self.assertEqual(kept["pieces"][0]["pickle"], b"events" * 100)
        h.pack()
        packed = h.of()["pieces"]
        self.assertEqual(zlib.decompress(packed[0]["zlib"]), b"events" * 100)
        self.assertEqual(h.bytes, sum(len(p["zlib"]) for p in packed))

    def test_past_its_limit_it_begins_at_a_later_checkpoint(self):
        h = vramtop_hook.history.History(limit=3000)
        for n in range(6):
            h.add(os.urandom(1000), b"state %d" % n)  # random: zlib does not shrink it
            h.pack()
        kinds = [p["kind"] for p in h.of()["pieces"]]
        # Whole pairs went, oldest first: it now begins at a checkpoint's state.
        self.assertEqual(kinds[0], "state")
        self.assertFalse(h.of()["from_start"])
        self.assertEqual(kinds, ["state", "events", "state", "events", "state"][: len(kinds)])
        self.assertLessEqual(h.bytes, 3000 + 1100)
        self.assertEqual(zlib.decompress(h.of()["pieces"][-1]["zlib"]), b"state 5")

    def test_a_restart_drops_what_came_before(self):
        h = vramtop_hook.history.History(limit=1 << 20)
        h.add(b"e", b"s1")
        h.restart(b"s2")
        self.assertEqual([(p["kind"], p["pickle"]) for p in h.of()["pieces"]], [("state", b"s2")])
        h.clear()
        self.assertIsNone(h.of())


class KeptHistoryTest(KeptFilesTest):
    """An OOM's file carries the pieces; over VRAMTOP_OOM_MAX_MB the oldest go first."""

    def test_the_oldest_pieces_go_first_to_keep_the_file_under_its_cap(self):
        h = vramtop_hook.history.History(limit=64 << 20)
        for _ in range(4):
            h.add(os.urandom(300 << 10), os.urandom(10 << 10))
        h.pack()
        vramtop_hook.oom.OOM_MAX_MB = 0.7  # room for about two events pieces
        oom = {
            "device": 0, "time_s": 1.0, "requested_bytes": 1 << 20, "device_free_bytes": 0,
            "device_total_bytes": 1 << 30, "stats": {}, "summary": "", "history": h.of(),
        }
        keeper = vramtop_hook.oom.OomKeeper()
        path = keeper.keep({"segments": [], "device_traces": [[]]}, oom)
        self.assertIsNotNone(path)
        with open(path, "rb") as f:
            kept = pickle.load(f)["vramtop_oom"]["history"]
        kinds = [p["kind"] for p in kept["pieces"]]
        self.assertEqual(kinds[0], "state")
        self.assertEqual(kinds[-1], "state")
        self.assertLess(len(kinds), 8)
        self.assertFalse(kept["from_start"])


class RingLookTest(unittest.TestCase):
    def test_a_fast_job_is_looked_at_before_a_quarter_of_the_ring_fills(self):
        period = vramtop_hook.history.ring_look_period
        slow = vramtop_hook.settings.RING_CHECK_S
        floor = vramtop_hook.settings.RING_FLOOR_RATE
        # No pace yet, or a slow one: timed as if at the floor rate (a job's start can burst
        # from nothing to GPT-2's pace between two looks), but never later than RING_CHECK_S.
        self.assertAlmostEqual(period(100, None, 1.0, 32768), min(slow, 0.25 * 32768 / floor))
        self.assertAlmostEqual(period(100, (0.5, 100), 1.0, 32768), min(slow, 0.25 * 32768 / floor))
        self.assertEqual(period(100, (0.5, 100), 1.0, 10**7), slow)  # a huge ring: the cap
        # 72,000 allocations a second (216,000 entries, above the floor): a quarter of 32,768
        # entries fills in 38 ms.
        self.assertAlmostEqual(period(72000, (0.0, 0), 1.0, 32768), 0.25 * 32768 / 216000)
        # Without free_requested (hook 1.7) the same allocations are 144,000 entries a second.
        self.assertAlmostEqual(period(72000, (0.0, 0), 1.0, 32768, per_allocation=2), 0.25 * 32768 / 144000)
        self.assertEqual(period(10**9, (0.0, 0), 1.0, 16384), 0.01)


class RingCopyWaitTest(unittest.TestCase):
    """The clear waits for the ring reader's copy by the reader's own CPU time
    (wait_for_the_copy), so a reader kept waiting (for the allocator's lock, for a core) is
    not overtaken. Threads stand in for PyTorch's read: a sleep for the wait (no CPU), a
    busy loop for the copy."""

    def reader(self, wait_s, copy_cpu_s, marks):
        import threading
        import time

        def run():
            clock = vramtop_hook.history.cpu_clock_of_this_thread()
            marks["call"] = (clock, time.clock_gettime(clock))
            time.sleep(wait_s)  # the lock held by the job: no CPU
            marks["copy_at"] = time.monotonic()
            spent = time.thread_time()
            while time.thread_time() - spent < copy_cpu_s:
                pass

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def test_a_reader_kept_from_the_lock_is_waited_for(self):
        import time

        wait = vramtop_hook.history.wait_for_the_copy
        marks = {}
        reader = self.reader(0.05, 0.2, marks)
        wait(reader, lambda: marks.get("call"), 0.002, poll_s=0.0005)
        done = time.monotonic()
        # Timed by the wall (hook 1.8: 0.3 ms and 0.03 us an entry) it came back 50 ms early.
        self.assertIn("copy_at", marks)
        self.assertGreater(done, marks["copy_at"])
        # And not at the reader's end: the copy's time, not the whole read's.
        self.assertTrue(reader.is_alive())
        reader.join()

    def test_a_reader_that_ends_before_its_call_is_not_waited_for_long(self):
        import threading
        import time

        wait = vramtop_hook.history.wait_for_the_copy
        reader = threading.Thread(target=lambda: None, daemon=True)
        reader.start()
        started = time.monotonic()
        wait(reader, lambda: None, 0.002, poll_s=0.0005)
        self.assertLess(time.monotonic() - started, 1.0)
        self.assertFalse(reader.is_alive())


class StepMarkTest(unittest.TestCase):
    def test_the_jobs_own_step_marks_go_where_optimizer_steps_go(self):
        class Alloc:
            steps = collections.deque(maxlen=4)

        class Hook:
            alloc = Alloc()

        saved = vramtop_hook.running.hook
        try:
            vramtop_hook.running.hook = None
            vramtop_hook.mark_step()  # no hook yet: nothing, and no error
            vramtop_hook.running.hook = Hook()
            for _ in range(6):
                vramtop_hook.mark_step()
            self.assertEqual(len(Hook.alloc.steps), 4)
        finally:
            vramtop_hook.running.hook = saved


if __name__ == "__main__":
    unittest.main()
