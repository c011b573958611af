"""The hook's framing and allocator translation, in-process (importing the hook starts nothing)."""

import json
import os
import random
import selectors
import socket
import struct
import sys
import time
import unittest

from support import HOOK_DIR, STUB_DIR

sys.path.insert(0, HOOK_DIR)
import vramtop_hook as hook  # noqa: E402


def frame(body):
    return struct.pack(">I", len(body)) + body


class FramingTest(unittest.TestCase):
    def test_encode_is_length_then_compact_json(self):
        data = hook.wire.encode({"type": "bye", "exit_code": None})
        (length,) = struct.unpack(">I", data[:4])
        self.assertEqual(length, len(data) - 4)
        self.assertEqual(json.loads(data[4:]), {"type": "bye", "exit_code": None})

    def test_reader_reassembles_frames_split_anywhere(self):
        stream = hook.wire.encode({"type": "subscribe", "interval_s": 0.5}) + hook.wire.encode({"type": "x"})
        for cut in range(len(stream) + 1):
            reader = hook.wire.FrameReader()
            got = reader.feed(stream[:cut]) + reader.feed(stream[cut:])
            self.assertEqual([m["type"] for m in got], ["subscribe", "x"], cut)

    def test_reader_refuses_a_length_over_its_limit_before_reading_the_body(self):
        reader = hook.wire.FrameReader(limit=1024)
        with self.assertRaises(hook.wire.ProtocolError):
            reader.feed(struct.pack(">I", 1025))
        with self.assertRaises(hook.wire.ProtocolError):
            hook.wire.FrameReader().feed(struct.pack(">I", 0xFFFFFFFF))

    def test_reader_refuses_bad_utf8_bad_json_and_non_objects(self):
        for body in (b"\xff\xfe", b"{not json", b"[1,2]", b'"type"', b'{"type": 3}', b"{}"):
            with self.assertRaises(hook.wire.ProtocolError, msg=body):
                hook.wire.FrameReader().feed(frame(body))

    def test_encode_refuses_a_frame_over_16_mib(self):
        with self.assertRaises(ValueError):
            hook.wire.encode({"type": "state", "pad": "x" * (16 * 1024 * 1024)})

    def test_encode_fitting_drops_segments_and_says_truncated(self):
        segment = {"address": 0, "total_size": 1, "blocks": [], "pad": "y" * 100000}
        message = {"type": "state", "segments": [segment] * 400, "truncated": False}
        data = hook.wire.encode_fitting(message)
        self.assertLessEqual(len(data) - 4, hook.settings.MAX_FRAME)
        decoded = json.loads(data[4:])
        self.assertTrue(decoded["truncated"])
        self.assertLess(len(decoded["segments"]), 400)
        self.assertGreater(len(decoded["segments"]), 0)


class WriteDisciplineTest(unittest.TestCase):
    """A viewer that reads slowly: frames are never torn, stale states are dropped, not
    queued, and of the kept messages only the latest of each kind waits."""

    def test_partial_writes_finish_their_frame_drop_states_and_keep_one_oom(self):
        ours, theirs = socket.socketpair()
        ours.setblocking(False)
        server = hook.server.Hook(history=False, forked=False)
        server.selector = selectors.DefaultSelector()
        viewer = hook.server.Viewer(ours, time.monotonic())
        server.viewers.append(viewer)
        big = hook.wire.encode({"type": "state", "seq": 0, "pad": "s" * 300000})
        for seq in range(20):  # the first is begun (the buffer is smaller), the rest dropped
            server.offer(viewer, big)
        self.assertTrue(viewer.pending)
        for n in range(50):
            server.offer(viewer, hook.wire.encode({"type": "oom", "n": n}), keep="oom")
        server.offer(viewer, hook.wire.encode({"type": "bye"}), keep="bye")
        self.assertEqual([kind for kind, _ in viewer.owed], ["oom", "bye"])
        reader, got = hook.wire.FrameReader(), []
        theirs.settimeout(0.2)
        while True:
            server.flush(viewer)
            try:
                data = theirs.recv(1 << 20)
            except socket.timeout:
                break
            got += reader.feed(data)
        self.assertEqual([m["type"] for m in got], ["state", "oom", "bye"])
        self.assertEqual(got[1]["n"], 49)
        self.assertEqual(len(got[0]["pad"]), 300000)
        ours.close()
        theirs.close()


class FormatTest(unittest.TestCase):
    def test_format_size_reads_as_pytorch_does(self):
        self.assertEqual(hook.torch_allocator.format_size(1024), "1024 bytes")
        self.assertEqual(hook.torch_allocator.format_size(6 * 1048576), "6.00 MiB")
        self.assertEqual(hook.torch_allocator.format_size(1073741824), "1024.00 MiB")
        self.assertEqual(hook.torch_allocator.format_size(3 * 1073741824 // 2), "1.50 GiB")

    def test_alloc_conf_parsing_keeps_bracketed_lists_whole(self):
        conf = hook.torch_allocator.parse_alloc_conf(
            "expandable_segments:True,roundup_power2_divisions:[256:1,512:2],max_split_size_mb:64"
        )
        self.assertEqual(conf["expandable_segments"], "True")
        self.assertEqual(conf["roundup_power2_divisions"], "[256:1,512:2]")
        self.assertEqual(conf["max_split_size_mb"], "64")


class FakeAlloc:
    """What HistoryDuty uses of TorchAllocator: an allocation counter and the switch."""

    def __init__(self, refuse=False, refuse_on=False):
        self.count = 0
        self.switches = []
        self.refuse = refuse
        self.refuse_on = refuse_on

    def allocation_count(self):
        return self.count

    def set_recording(self, on):
        if self.refuse or (on and self.refuse_on):
            return False
        self.switches.append(on)
        return True


class HistoryDutyTest(unittest.TestCase):
    def duty(self, alloc, offset=lambda room: 0.0):
        """A duty whose first period began at 0; each window opens `offset(room)` in."""
        duty = hook.history.HistoryDuty(alloc, offset=offset)
        duty.period_start, duty.next_switch, duty.last_count = 0.0, hook.settings.HISTORY_PERIOD_S, 0
        return duty

    def test_a_job_that_allocates_slowly_is_recorded_whole(self):
        alloc = FakeAlloc()
        duty = self.duty(alloc)
        for second in range(1, 6):
            alloc.count += int(hook.settings.HISTORY_RATE / 2)
            duty.tick(float(second))
        self.assertEqual(duty.share, 1.0)
        self.assertEqual(alloc.switches, [])  # never turned off

    def test_a_fast_allocator_is_recorded_for_a_share_of_each_period(self):
        alloc = FakeAlloc()
        duty = self.duty(alloc)
        alloc.count += int(hook.settings.HISTORY_RATE * 5)  # five times the rate: a fifth recorded
        duty.tick(1.0)
        self.assertAlmostEqual(duty.share, 0.2)
        self.assertAlmostEqual(duty.next_switch, 1.2)
        duty.tick(1.1)
        self.assertEqual(alloc.switches, [])  # still inside its share
        duty.tick(1.2)
        self.assertEqual(alloc.switches, [False])
        self.assertAlmostEqual(duty.next_switch, 2.0)
        alloc.count += int(hook.settings.HISTORY_RATE * 5)
        duty.tick(2.0)
        self.assertEqual(alloc.switches, [False, True])
        # However fast the job, a sliver of each period is still recorded.
        alloc.count += int(hook.settings.HISTORY_RATE * 1000)
        duty.tick(2.2)
        duty.tick(3.0)
        self.assertEqual(duty.share, hook.settings.HISTORY_MIN_SHARE)

    def test_the_recorded_window_can_sit_anywhere_in_the_period(self):
        # A step that divides the period must not be seen at the same point every time.
        alloc = FakeAlloc()
        duty = self.duty(alloc, offset=lambda room: room / 2)
        alloc.count += int(hook.settings.HISTORY_RATE * 5)
        duty.tick(1.0)  # share 0.2: the window is [1.4, 1.6)
        self.assertEqual(alloc.switches, [False])
        self.assertAlmostEqual(duty.next_switch, 1.4)
        duty.tick(1.4)
        self.assertEqual(alloc.switches, [False, True])
        self.assertAlmostEqual(duty.next_switch, 1.6)
        duty.tick(1.6)
        self.assertEqual(alloc.switches, [False, True, False])
        self.assertAlmostEqual(duty.next_switch, 2.0)
        # At most two switches a period: one that opens at the period's start needs one.
        alloc.count += int(hook.settings.HISTORY_RATE * 5)
        duty.offset = lambda room: 0.0
        duty.tick(2.0)
        self.assertEqual(alloc.switches, [False, True, False, True])
        # The default places it at random, inside the room the share leaves, and leaves
        # the job's own random numbers as they were.
        random.seed(7)
        expected = [random.random() for _ in range(3)]
        random.seed(7)
        default = hook.history.HistoryDuty(FakeAlloc())
        starts = [default.offset(0.8) for _ in range(200)]
        self.assertEqual([random.random() for _ in range(3)], expected)
        self.assertTrue(all(0.0 <= x <= 0.8 for x in starts))
        self.assertGreater(max(starts) - min(starts), 0.4)

    def test_a_torch_that_refuses_the_switch_is_left_recording(self):
        alloc = FakeAlloc(refuse=True)
        duty = self.duty(alloc)
        alloc.count += int(hook.settings.HISTORY_RATE * 10)
        duty.tick(1.0)
        duty.tick(1.1)
        self.assertTrue(duty.recording)
        self.assertEqual(duty.share, 1.0)  # it could not be turned off: all recorded
        # No more switching, and no wake-up owed (a past next_switch spun the thread).
        self.assertEqual(duty.next_switch, float("inf"))
        duty.tick(5.0)
        self.assertTrue(duty.recording)

    def test_a_torch_that_refuses_to_turn_back_on_says_nothing_is_recorded(self):
        alloc = FakeAlloc(refuse_on=True)
        duty = self.duty(alloc)
        alloc.count += int(hook.settings.HISTORY_RATE * 10)
        duty.tick(1.0)
        duty.tick(1.1)  # off: accepted
        self.assertFalse(duty.recording)
        alloc.count += int(hook.settings.HISTORY_RATE * 10)
        duty.tick(2.0)  # on: refused
        self.assertFalse(duty.recording)
        self.assertEqual(duty.share, 0.0)
        self.assertEqual(duty.next_switch, float("inf"))


def spin(seconds):
    """Burns this thread's CPU for `seconds` (thread_time is what the hook paces on)."""
    until = time.thread_time() + seconds
    while time.thread_time() < until:
        pass


class EnvironmentTest(unittest.TestCase):
    def test_a_rate_that_is_not_a_positive_number_is_said_and_the_default_kept(self):
        import subprocess

        for text in ("abc", "nan", "-3", "0"):
            env = dict(os.environ, VRAMTOP_HISTORY_RATE=text, PYTHONPATH=HOOK_DIR)
            done = subprocess.run(
                [sys.executable, "-c", "import vramtop_hook as h; print(h.settings.HISTORY_RATE)"],
                env=env, capture_output=True, text=True, timeout=30,
            )
            self.assertEqual(done.stdout.strip(), "5000.0", text)
            self.assertIn("VRAMTOP_HISTORY_RATE=%r is not a positive number" % text, done.stderr)


class PacingTest(unittest.TestCase):
    def test_one_slow_read_is_forgiven_and_the_next_slow_one_is_paced(self):
        costs = iter([0.002, 0.06, 0.002, 0.06])

        class SlowOnce:
            history_on = False
            ring_entries = 0

            def collect(self, raw=None, segments=True):
                spin(next(costs))
                return {"device": 0, "stats": None, "settings": {}, "segments": [], "truncated": False}

        paced = hook.server.Hook(False, forked=False)
        paced.alloc = SlowOnce()
        gaps = []
        for _ in range(4):
            started = time.monotonic()
            self.assertIsNotNone(paced.state_frame())
            gaps.append(paced.next_collect - started)
        # 2 ms of CPU is 1 % of 0.2 s. The 60 ms read is forgiven (paced as the 2 ms one
        # before it); the next 60 ms read within FORGIVE_S is paced on its cost: 6 s.
        self.assertLess(gaps[1], 1.0)
        self.assertGreater(gaps[3], 4.0)


class AllocatorTranslationTest(unittest.TestCase):
    """TorchAllocator against the stub torch loaded in this process."""

    @classmethod
    def setUpClass(cls):
        sys.path.insert(0, STUB_DIR)
        import torch

        cls.torch = torch
        torch.cuda.init()
        torch.cuda.stub_alloc("p", 3 * 1048576)
        torch.cuda.stub_alloc("q", 1000)
        torch.cuda.stub_free("q")

    def test_collect_matches_the_allocators_own_figures(self):
        alloc = hook.torch_allocator.TorchAllocator(self.torch)
        state = alloc.collect()
        stats = self.torch.cuda.memory_stats(0)
        self.assertEqual(state["stats"]["allocated_bytes"], stats["allocated_bytes.all.current"])
        self.assertEqual(state["stats"]["reserved_bytes"], stats["reserved_bytes.all.current"])
        reserved = sum(s["total_size"] for s in state["segments"])
        self.assertEqual(reserved, stats["reserved_bytes.all.current"])
        for segment in state["segments"]:
            self.assertEqual(sum(b["size"] for b in segment["blocks"]), segment["total_size"])
            first = segment["blocks"][0]
            self.assertEqual(first["address"], segment["address"])

    def test_settings_fall_back_to_the_environment(self):
        alloc = hook.torch_allocator.TorchAllocator(self.torch)
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True,max_split_size_mb:128"
        try:
            settings = alloc.settings(None)
        finally:
            del os.environ["PYTORCH_CUDA_ALLOC_CONF"]
        self.assertTrue(settings["expandable_segments"])
        self.assertEqual(settings["max_split_size"], 128 * 1048576)
        self.assertEqual(settings["raw"], "expandable_segments:True,max_split_size_mb:128")

    def test_block_cap_truncates(self):
        alloc = hook.torch_allocator.TorchAllocator(self.torch)
        old = hook.torch_allocator.MAX_BLOCKS
        hook.torch_allocator.MAX_BLOCKS = 1
        try:
            state = alloc.collect()
        finally:
            hook.torch_allocator.MAX_BLOCKS = old
        self.assertTrue(state["truncated"])
        self.assertEqual(sum(len(s["blocks"]) for s in state["segments"]), 1)

    def test_site_skips_torch_stdlib_and_site_packages(self):
        alloc = hook.torch_allocator.TorchAllocator(self.torch)
        torch_file = os.path.join(os.path.dirname(self.torch.__file__), "nn", "modules", "linear.py")
        frames = [
            {"filename": torch_file, "line": 125, "name": "forward"},
            {"filename": os.__file__, "line": 1, "name": "stdlib"},
            {"filename": "/venv/lib/python3.11/site-packages/transformers/x.py", "line": 9, "name": "f"},
            {"filename": "/home/me/train.py", "line": 42, "name": "step"},
            {"filename": "/home/me/main.py", "line": 7, "name": "<module>"},
        ]
        self.assertEqual(alloc.site(frames), "/home/me/train.py:42 step")
        self.assertIsNone(alloc.site(frames[:3]))
        self.assertIsNone(alloc.site([]))


class CheckpointTest(unittest.TestCase):
    """A checkpoint of the ring, in-process against the stub torch. The stub has no
    libtorch_cuda.so, so PyTorch's C++ pickled read is stood in for by `PickledRead`:
    the stub's own snapshot, pickled (as `_memory_snapshot_pickled()` pickles _snapshot())."""

    class PickledRead:
        def __init__(self, torch):
            self.torch = torch
            self.reads = 0

        def read(self, before_call=None):
            import pickle

            self.reads += 1
            if before_call is not None:
                before_call()
            return pickle.dumps(self.torch.cuda.memory._snapshot())

    @classmethod
    def setUpClass(cls):
        sys.path.insert(0, STUB_DIR)
        import torch

        cls.torch = torch
        torch.cuda.init()

    def test_a_pytorch_that_names_skip_actions_but_refuses_it_keeps_free_requested(self):
        torch = self.torch
        memory = torch.cuda.memory
        real = memory._record_memory_history

        def refusing(enabled="all", context="all", stacks="all", max_entries=sys.maxsize, device=None,
                     clear_history=False, compile_context=False, global_record_annotations=False,
                     skip_actions=None):
            if skip_actions:
                raise TypeError("skip_actions refused")
            return real(enabled, context, stacks, max_entries, device, clear_history, compile_context,
                        global_record_annotations)

        memory._record_memory_history = refusing
        try:
            alloc = hook.torch_allocator.TorchAllocator(torch)
            alloc.start_ring(64)
            self.assertEqual(alloc.ring_entries, 64)  # the ring runs, with free_requested
            self.assertFalse(alloc.skips_requests)
            self.assertEqual(alloc.entries_per_allocation, 3)
            self.assertNotIn("ring_without_free_requested", alloc.capabilities)
            torch.cuda.stub_alloc("refused-skip", 1048576)
            torch.cuda.stub_free("refused-skip")
            actions = [e["action"] for e in memory._snapshot()["device_traces"][0]]
            self.assertIn("free_requested", actions)
        finally:
            memory._record_memory_history = real
            real(enabled=None)

    def test_a_checkpoint_clears_the_ring_in_place_and_keeps_its_state_pickled(self):
        import pickle
        import zlib

        torch = self.torch
        alloc = hook.torch_allocator.TorchAllocator(torch)
        torch.cuda.stub_alloc("cp-before", 1048576)  # before the ring: it needs a checkpoint
        alloc.start_ring(64)
        try:
            # The stub names skip_actions, as 2.11 does: the ring skips free_requested.
            self.assertIn("ring_without_free_requested", alloc.capabilities)
            self.assertEqual(alloc.entries_per_allocation, 2)
            alloc.pickled = reader = self.PickledRead(torch)
            self.assertTrue(alloc.ring_may_be_full())
            calls = len(torch.cuda.memory.history_calls)
            self.assertTrue(alloc.restart_ring(stacks=False))
            # One call, cleared in place: never off (the annotation callback stays) and
            # never resized.
            self.assertEqual(torch.cuda.memory.history_calls[calls:], [
                {"enabled": "all", "context": None, "stacks": "python", "max_entries": 64, "clear_history": True,
                 "skip_actions": ["free_requested"]},
            ])
            self.assertIsNone(alloc.checkpoint["raw"])  # not unpickled until asked
            torch.cuda.stub_alloc("cp-after", 2 * 1048576)
            self.assertTrue(alloc.restart_ring(stacks=False))
            self.assertEqual(reader.reads, 3)  # state; then events (the ring read whole) and state
            kinds = [p["kind"] for p in alloc.history.of()["pieces"]]
            self.assertEqual(kinds, ["state", "events", "state"])
            events = pickle.loads(zlib.decompress(alloc.history.of()["pieces"][1]["zlib"]))
            actions = [e["action"] for e in events["device_traces"][0]]
            self.assertIn("alloc", actions)  # cp-after's, read before the ring was cleared
            # What an OOM's file carries, unpickled now: the segments at the checkpoint.
            checkpoint = alloc.checkpoint_of(0)
            sizes = sorted(b["size"] for s in checkpoint["segments"] for b in s["blocks"] if b["state"] == "active_allocated")
            self.assertIn(2 * 1048576, sizes)
            self.assertEqual(checkpoint["skip"], 0)  # the ring was empty when it was read
            self.assertEqual(alloc.checkpoint_raw()["segments"], checkpoint["segments"])
        finally:
            alloc._record(enabled=None)
            torch.cuda.stub_free("cp-before")
            torch.cuda.stub_free("cp-after")

    def checkpoint_after_an_alloc(self, reader_class, times):
        """A checkpoint read by `reader_class`, one allocation, and a second one with its
        clear timed into `times` ("cleared"): the history's pieces and the events piece's
        actions."""
        import pickle
        import zlib

        torch = self.torch
        alloc = hook.torch_allocator.TorchAllocator(torch)
        alloc.start_ring(64)
        clear = alloc.clear_ring

        def timed_clear(*a, **k):
            times.setdefault("cleared", time.monotonic())
            return clear(*a, **k)

        try:
            alloc.pickled = reader_class(torch)
            self.assertTrue(alloc.restart_ring(stacks=False))  # the history begins here
            times.clear()
            torch.cuda.stub_alloc("second", 1048576)
            alloc.clear_ring = timed_clear
            self.assertTrue(alloc.restart_ring(stacks=False))
            pieces = alloc.history.of()["pieces"]
            events = pickle.loads(zlib.decompress(pieces[1]["zlib"])) if len(pieces) > 1 else {}
            actions = [e["action"] for e in (events.get("device_traces") or [[]])[0]]
            return [p["kind"] for p in pieces], actions
        finally:
            alloc._record(enabled=None)
            torch.cuda.stub_free("second")

    def test_the_ring_is_cleared_while_its_read_still_pickles_and_the_read_holds_it_whole(self):
        times = {}

        class SlowPickle(self.PickledRead):
            """Copies the ring at once, then "pickles" for 200 ms of its CPU, as PyTorch's
            read does."""

            def read(self, before_call=None):
                snap = super().read(before_call)
                if self.reads > 1:  # the events read, not the checkpoint's first state
                    times.setdefault("copied", time.monotonic())
                    spent = time.thread_time()
                    while time.thread_time() - spent < 0.2:
                        pass
                    times.setdefault("returned", time.monotonic())
                return snap

        kinds, actions = self.checkpoint_after_an_alloc(SlowPickle, times)
        self.assertLess(times["copied"], times["cleared"])
        self.assertLess(times["cleared"], times["returned"])  # not after the read
        self.assertEqual(kinds, ["state", "events", "state"])
        self.assertIn("alloc", actions)

    def test_a_read_kept_waiting_for_the_lock_is_waited_for_and_holds_the_ring_whole(self):
        times = {}

        class WaitedRead(self.PickledRead):
            """The reader's call waits 100 ms for the allocator's lock (the job holds it
            while cudaMalloc runs) before it copies the ring: no CPU meanwhile."""

            def read(self, before_call=None):
                if self.reads >= 1 and before_call is not None:
                    before_call()
                    time.sleep(0.1)
                    times["copied"] = time.monotonic()
                    before_call = None
                return super().read(before_call)

        kinds, actions = self.checkpoint_after_an_alloc(WaitedRead, times)
        # Hook 1.8 cleared 0.3 ms after the call, by the wall: before this copy.
        self.assertLess(times["copied"], times["cleared"])
        self.assertEqual(kinds, ["state", "events", "state"])
        self.assertIn("alloc", actions)

    def test_a_read_that_came_after_the_clearing_begins_the_history_again(self):
        torch = self.torch
        alloc = hook.torch_allocator.TorchAllocator(torch)
        alloc.start_ring(64)

        class LateRead(self.PickledRead):
            """A copy that comes after the hook cleared all the same: the reader ran more
            than the copy's CPU time after its call (RING_COPY_CPU_S) before it took the
            lock, then waited for it."""

            def read(self, before_call=None):
                if self.reads >= 1 and before_call is not None:
                    before_call()
                    spent = time.thread_time()
                    while time.thread_time() - spent < 0.01:
                        pass
                    time.sleep(0.1)
                    before_call = None
                return super().read(before_call)

        try:
            alloc.pickled = LateRead(torch)
            self.assertTrue(alloc.restart_ring(stacks=False))
            for i in range(8):
                torch.cuda.stub_alloc("late-%d" % i, 1048576)
            self.assertTrue(alloc.restart_ring(stacks=False))
            # Not kept as the ring since the last checkpoint: the history begins anew here.
            self.assertEqual([p["kind"] for p in alloc.history.of()["pieces"]], ["state"])
        finally:
            alloc._record(enabled=None)
            for i in range(8):
                torch.cuda.stub_free("late-%d" % i)

    def test_a_checkpoint_that_cannot_be_unpickled_is_left_out_not_raised(self):
        alloc = hook.torch_allocator.TorchAllocator(self.torch)
        alloc.checkpoint = {"time_s": 1.0, "pickled": b"not a pickle", "raw": None}
        self.assertIsNone(alloc.checkpoint_of(0))  # the OOM's file goes on without it
        self.assertIsNone(alloc.checkpoint_raw())

    def test_a_checkpoint_waits_while_an_oom_reads(self):
        alloc = hook.torch_allocator.TorchAllocator(self.torch)
        alloc.start_ring(64)
        saved = hook.torch_allocator.OOM_WAIT_S
        try:
            hook.torch_allocator.OOM_WAIT_S = 0.05
            with alloc.reading_at_oom():
                # The ring stays as the OOM reads it: no checkpoint clears it meanwhile.
                self.assertFalse(alloc.restart_ring(stacks=False))
            self.assertTrue(alloc.restart_ring(stacks=False))
        finally:
            hook.torch_allocator.OOM_WAIT_S = saved
            alloc._record(enabled=None)

    def test_an_ooms_reads_wait_for_a_checkpoint_and_never_for_long(self):
        alloc = hook.torch_allocator.TorchAllocator(self.torch)
        # A checkpoint that never ends does not hold the OOM past the bound (a wait that
        # ignored it would hang here; 5 s leaves room for a slow machine).
        alloc.checkpoint_lock.acquire()
        began = time.monotonic()
        with alloc.reading_at_oom(timeout_s=0.05):
            pass
        self.assertLess(time.monotonic() - began, 5.0)
        alloc.checkpoint_lock.release()

    def test_the_oom_observer_reads_the_allocator_only_after_a_checkpoint_under_way(self):
        import tempfile
        import threading

        alloc = hook.torch_allocator.TorchAllocator(self.torch)
        order = []
        taken = alloc.raw_snapshot

        def raw_snapshot(on_job_thread=False):
            order.append("oom read")
            return taken(on_job_thread=on_job_thread)

        alloc.raw_snapshot = raw_snapshot

        class Hook:
            pid = os.getpid()
            kept = {}
            listener = None

            def keep_and_tell(self, kind, frame):  # no viewers: kept only
                self.kept[kind] = frame

        Hook.alloc = alloc
        alloc.checkpoint_lock.acquire()  # a checkpoint under way

        def checkpoint_ends():
            time.sleep(0.1)
            order.append("checkpoint kept")
            alloc.checkpoint_lock.release()

        saved, saved_dir = hook.running.hook, os.environ.get("VRAMTOP_OOM_DIR")
        with tempfile.TemporaryDirectory() as oom_dir:
            os.environ["VRAMTOP_OOM_DIR"] = oom_dir
            try:
                hook.running.hook = Hook()
                threading.Thread(target=checkpoint_ends).start()
                hook.oom.on_oom(0, 1 << 20, 1 << 30, 0)
            finally:
                hook.running.hook = saved
                if saved_dir is None:
                    os.environ.pop("VRAMTOP_OOM_DIR", None)
                else:
                    os.environ["VRAMTOP_OOM_DIR"] = saved_dir
            self.assertEqual(order, ["checkpoint kept", "oom read"])
            self.assertIn("oom", Hook.kept)  # the observer went on to its report
            self.assertFalse(alloc.checkpoint_lock.locked())  # and let checkpoints go on


if __name__ == "__main__":
    unittest.main()
