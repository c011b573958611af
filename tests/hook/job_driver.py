"""A PyTorch-like job for the hook's tests, driven line by line on stdin, against the
stub torch (SIMULATED). Each command answers one line on stdout starting with "ok"."""

import os
import sys
import threading
import time

kept = {}


def alloc_named(torch, name, size):
    torch.cuda.stub_alloc(name, size)  # LEAK-SITE: history must name this line


def pace(iterations):
    """A loop of 10 ms steps, timed: if the hook ever blocks the job it shows here."""
    started = time.monotonic()
    for _ in range(iterations):
        time.sleep(0.01)
    return time.monotonic() - started


def main():
    torch = None
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        cmd, args = words[0], words[1:]
        reply = "ok"
        if cmd == "userhook":  # the job's own excepthook, set before torch comes in

            def user_hook(kind, value, tb):
                sys.stderr.write("USER HOOK saw %s\n" % kind.__name__)

            sys.excepthook = user_hook
        elif cmd == "import":
            import torch
        elif cmd == "init":
            torch.cuda.init()
        elif cmd == "cuda?":
            reply = "ok %s" % torch.cuda.is_initialized()
        elif cmd == "alloc":
            alloc_named(torch, args[0], int(args[1]))
        elif cmd == "free":
            torch.cuda.stub_free(args[0])
        elif cmd == "oom":
            try:
                torch.cuda.stub_oom(int(args[0]))
            except torch.OutOfMemoryError as err:
                reply = "ok caught %s" % type(err).__name__
        elif cmd == "rush":  # import, init and OOM at once: no time for the hook to poll
            import torch

            torch.cuda.init()
            try:
                torch.cuda.stub_oom(int(args[0]))
            except torch.OutOfMemoryError:
                reply = "ok caught"
        elif cmd == "hang_at_exit":  # as a rank whose exit waits on its peers (NCCL's teardown)
            import atexit

            def wait_for_peers(seconds=float(args[0])):
                time.sleep(seconds)
                sys.stderr.write("job: exit after waiting\n")

            atexit.register(wait_for_peers)
        elif cmd == "crash":  # an uncaught error that is not an OOM
            raise ValueError("not memory")
        elif cmd == "oom_wrapped":  # as a framework that wraps the OOM it lets through
            try:
                torch.cuda.stub_oom(int(args[0]))
            except torch.OutOfMemoryError as err:
                raise RuntimeError("training step failed") from err
        elif cmd == "oom_copied_uncaught":  # a copy of a caught OOM raised (as a pool's re-raise)
            import copy

            try:
                torch.cuda.stub_oom(int(args[0]))
            except torch.OutOfMemoryError as err:
                raise copy.copy(err) from None
        elif cmd == "oom_uncaught":
            torch.cuda.stub_oom(int(args[0]))
        elif cmd == "oom_in_thread":
            thread = threading.Thread(target=torch.cuda.stub_oom, args=(int(args[0]),))
            thread.start()
            thread.join()
        elif cmd == "pace":
            reply = "ok %.3f" % pace(int(args[0]))
        elif cmd == "fork":
            reply = "ok %d" % fork_child(torch, args[0])
        elif cmd == "spawn":  # a child started fresh, as a DataLoader's spawned worker
            reply = "ok %d" % spawn_child(args[0])
        elif cmd == "start":  # the hook started by hand (VRAMTOP_HOOK=0: no bootstrap)
            import vramtop_hook

            vramtop_hook.start()
        elif cmd == "user_history":  # the job's own call, as users debug memory
            torch.cuda.memory._record_memory_history(enabled="all", max_entries=100000)
        elif cmd == "traces":  # what a snapshot's trace holds now
            reply = "ok %d" % len(torch.cuda.memory._snapshot()["device_traces"][0])
        elif cmd == "inductor?":  # which thread imported torch._inductor, if one did
            reply = "ok %s" % getattr(sys.modules.get("torch._inductor"), "IMPORTED_BY", "none")
        elif cmd == "history":
            reply = "ok %r" % (torch.cuda.memory.history_calls,)
        elif cmd == "step":  # an optimizer step, as a training loop makes
            torch.optim.Optimizer().step()
        elif cmd in ("scaler_step", "scaler_skip"):  # GradScaler.step, run or skipped (infs)
            scaler = torch.amp.GradScaler()
            scaler.found_inf = cmd == "scaler_skip"
            scaler.step(torch.optim.Optimizer())
        elif cmd == "exit":
            sys.stdout.write("ok\n")
            sys.stdout.flush()
            sys.exit(int(args[0]))
        print(reply, flush=True)


def fork_child(torch, mode):
    """Fork a child. "plain": exits at once through sys.exit (atexit runs in the child).
    "cuda": initialises (stub) CUDA in the child and lives until its stdin-less sleep ends."""
    pid = os.fork()
    if pid == 0:
        if mode == "cuda":
            torch.cuda.init()
            alloc_named(torch, "child", 4 * 1024 * 1024)
            time.sleep(float(os.environ.get("CHILD_LIFE_S", "3")))
        sys.exit(0)
    if mode == "plain":
        os.waitpid(pid, 0)
    return pid


SPAWNED = []  # kept, so that multiprocessing does not reap them early


def spawn_child(mode):
    """Start a child by multiprocessing's spawn: a fresh interpreter (the hook's bootstrap
    runs in it) that imports torch. "plain": never uses CUDA, as a DataLoader's worker;
    "cuda": initialises (stub) CUDA and allocates, as mp.spawn's ranks do. Each lives
    CHILD_LIFE_S and is ended with the driver (daemon)."""
    import multiprocessing

    child = multiprocessing.get_context("spawn").Process(
        target=spawned_life, args=(mode, float(os.environ.get("CHILD_LIFE_S", "3"))), daemon=True)
    child.start()
    SPAWNED.append(child)
    return child.pid


def spawned_life(mode, seconds):
    import torch

    if mode == "cuda":
        torch.cuda.init()
        alloc_named(torch, "child", 4 * 1024 * 1024)
    time.sleep(seconds)


if __name__ == "__main__":
    main()
