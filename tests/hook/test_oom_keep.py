"""Every OOM of a hooked job is kept on disk, viewer or not (OomKeeper in the hook): a
PyTorch memory snapshot per OOM, bounded (the first 3 and the latest), never breaking the
job, one line on stderr when it cannot write. Real job processes under the real bootstrap,
against the stub torch (SIMULATED)."""

import os
import pickle
import shutil
import tempfile
import unittest

from support import Job, Viewer

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
        job = self.ready_job(VRAMTOP_OOM_TAG="run7")
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
        # History off: one `oom` entry as PyTorch writes them, marked as ours.
        entry = snapshot["device_traces"][0][-1]
        self.assertEqual(entry["action"], "oom")
        self.assertEqual(entry["size"], 1024 * MiB)
        self.assertTrue(entry["vramtop_added"])
        rc, _, err = job.finish()
        self.assertEqual(rc, 0)
        self.assertIn("vramtop: OOM 1: allocator state kept in %s" % os.path.join(self.oom_dir, name), err)
        self.assertIn("open it with: vramtop snapshot", err)

    def test_the_first_three_and_the_latest_are_kept(self):
        job = self.ready_job()
        for size in (100, 200, 300, 400, 500):
            self.assertEqual(job.do("oom %d" % (size * MiB)), "ok caught OutOfMemoryError")
        pid = job.proc.pid
        self.assertEqual(
            self.kept(),
            ["vramtop-oom-%d-%s.pickle" % (pid, n) for n in ("1", "2", "3", "last")],
        )
        with open(os.path.join(self.oom_dir, "vramtop-oom-%d-last.pickle" % pid), "rb") as f:
            last = pickle.load(f)["vramtop_oom"]
        self.assertEqual((last["number"], last["requested_bytes"]), (5, 500 * MiB))
        rc, _, err = job.finish()
        self.assertEqual(rc, 0)
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

    def test_over_the_size_cap_nothing_is_written_and_it_is_said(self):
        job = self.ready_job(VRAMTOP_OOM_MAX_MB="0.0001")
        self.assertEqual(job.do("oom %d" % MiB), "ok caught OutOfMemoryError")
        rc, _, err = job.finish()
        self.assertEqual(rc, 0)
        self.assertEqual(self.kept(), [])
        self.assertIn("over VRAMTOP_OOM_MAX_MB; not kept", err)

    def test_quiet_keeps_the_file_and_says_nothing(self):
        job = self.ready_job(VRAMTOP_OOM_QUIET="1")
        self.assertEqual(job.do("oom %d" % MiB), "ok caught OutOfMemoryError")
        rc, _, err = job.finish()
        self.assertEqual(rc, 0)
        self.assertEqual(len(self.kept()), 1)
        self.assertNotIn("vramtop: OOM", err)


if __name__ == "__main__":
    unittest.main()
