"""The sitecustomize bootstrap: a user's own sitecustomize still runs, a job without torch
runs untouched, the hook can be turned off, and a notebook can start it by import."""

import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

from support import HOOK_DIR, STUB_DIR, Viewer, hook_env, wait_for

NO_TORCH_JOB = textwrap.dedent(
    """
    import sys, threading
    print("hello from a job without torch")
    print(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "vramtop_hook")))
    print("threads", threading.active_count())
    sys.stderr.write("its own stderr\\n")
    sys.exit(7)
    """
)


def run(code, env, timeout=30):
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout
    )


class BootstrapTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="vtb-")
        os.chmod(self.dir, 0o700)

    def tearDown(self):
        Viewer.close_all()

    def test_a_job_without_torch_runs_untouched(self):
        hooked = hook_env(self.dir)
        hooked["PYTHONPATH"] = HOOK_DIR  # no torch to be found at all
        plain = dict(hooked)
        del plain["PYTHONPATH"]
        with_hook = run(NO_TORCH_JOB, hooked)
        without = run(NO_TORCH_JOB, plain)
        self.assertEqual(with_hook.returncode, 7)
        self.assertEqual((with_hook.stdout, with_hook.stderr), (without.stdout, without.stderr))
        self.assertIn("[]", with_hook.stdout)  # neither torch nor the hook was imported
        self.assertIn("threads 1", with_hook.stdout)  # and no thread was started
        self.assertEqual(os.listdir(self.dir), [])

    def test_a_failed_import_of_torch_changes_nothing(self):
        env = hook_env(self.dir)
        env["PYTHONPATH"] = HOOK_DIR
        code = textwrap.dedent(
            """
            try:
                import torch
            except ImportError as err:
                print("no torch:", err)
            """
        )
        result = run(code, env)
        self.assertEqual(result.returncode, 0)
        self.assertEqual(result.stdout, "no torch: No module named 'torch'\n")
        self.assertEqual(result.stderr, "")

    def test_the_users_sitecustomize_still_runs_under_its_own_name(self):
        user_dir = tempfile.mkdtemp(prefix="vtb-user-")
        marker = os.path.join(user_dir, "marker")
        with open(os.path.join(user_dir, "sitecustomize.py"), "w") as f:
            f.write("open(%r, 'w').write(__name__ + ' ' + __file__)\n" % marker)
        env = hook_env(self.dir, extra_path=[user_dir])
        code = textwrap.dedent(
            """
            import os, sys, sitecustomize
            print(sitecustomize.__file__)
            import torch
            torch.cuda.init()
            path = os.path.join(os.environ["VRAMTOP_SOCKET_DIR"], "vramtop-%d.sock" % os.getpid())
            import time
            for _ in range(200):
                if os.path.exists(path):
                    break
                time.sleep(0.02)
            print("socket", os.path.exists(path))
            """
        )
        result = run(code, env)
        self.assertEqual(result.returncode, 0, result.stderr)
        with open(marker) as f:
            self.assertEqual(f.read(), "sitecustomize " + os.path.join(user_dir, "sitecustomize.py"))
        lines = result.stdout.splitlines()
        self.assertEqual(lines[0], os.path.join(user_dir, "sitecustomize.py"))
        self.assertEqual(lines[1], "socket True")  # and the hook works beside it

    def test_our_directory_twice_on_the_path_does_not_recurse(self):
        env = hook_env(self.dir, extra_path=[HOOK_DIR])
        result = run("import sitecustomize; print(sitecustomize.__name__)", env)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout, "sitecustomize\n")

    def test_vramtop_hook_0_turns_it_off(self):
        env = hook_env(self.dir, VRAMTOP_HOOK="0")
        code = "import sys, torch; torch.cuda.init(); import time; time.sleep(0.6); " \
               "print('vramtop_hook' in sys.modules)"
        result = run(code, env)
        self.assertEqual(result.stdout, "False\n")
        self.assertEqual(os.listdir(self.dir), [])

    def test_a_notebook_starts_it_by_import(self):
        env = hook_env(self.dir)
        env["PYTHONPATH"] = STUB_DIR  # no bootstrap: the user imports the hook
        code = textwrap.dedent(
            """
            import sys, time
            sys.path.insert(0, %r)
            import torch
            import vramtop_hook
            vramtop_hook.start()
            vramtop_hook.start()  # twice is harmless
            torch.cuda.init()
            print("ready", flush=True)
            sys.stdin.readline()
            """
            % HOOK_DIR
        )
        proc = subprocess.Popen(
            [sys.executable, "-c", code], env=env, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        try:
            self.assertEqual(proc.stdout.readline(), "ready\n")
            path = os.path.join(self.dir, "vramtop-%d.sock" % proc.pid)
            self.assertTrue(wait_for(lambda: os.path.exists(path), timeout=5))
            self.assertEqual(os.listdir(self.dir), ["vramtop-%d.sock" % proc.pid])
            viewer = Viewer(path)
            viewer.ready_hello()
            viewer.subscribe(0.05)
            self.assertEqual(viewer.recv_type("state")["type"], "state")
        finally:
            proc.stdin.close()
            proc.wait(10)
            proc.stdout.close()
            proc.stderr.close()
        self.assertEqual(proc.returncode, 0)
        self.assertFalse(os.path.exists(path))


if __name__ == "__main__":
    unittest.main()
