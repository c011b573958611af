"""vramtop in Python: the job hook that `vramtop run` injects, as a package.

    import vramtop
    vramtop.start()              # serve this process's CUDA allocator to vramtop viewers
    vramtop.hook_path()          # the folder to put first on PYTHONPATH for child jobs
    vramtop.step()               # mark the end of a step, in a loop with no torch optimizer

In Jupyter or IPython: `%load_ext vramtop`, then `%vramtop` (start the hook and print the
command to watch it) and `%vramtop status` (this kernel's allocator, summed up).

The `vramtop` command itself (the terminal UI) is installed beside this package by the
same wheel. The files in `_hook/` are the hook itself: the binary embeds these same files.
"""

# Imported under private names: `dir(vramtop)` and tab completion show only its API.
import importlib.util as _importlib_util
import json as _json
import os as _os
import shutil as _shutil
import subprocess as _subprocess
import sys as _sys
import sysconfig as _sysconfig

__all__ = ["start", "step", "hook_path", "binary", "status", "load_ipython_extension"]

_HOOK_DIR = _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "_hook")


def hook_path():
    """The folder holding the hook's `sitecustomize.py` and the `vramtop_hook`
    package: first on
    PYTHONPATH, it hooks every Python process started with it, as `vramtop run` does."""
    return _HOOK_DIR


def start(history=False):
    """Start the hook in this process (idempotent): viewers (`vramtop`, `vramtop attach`)
    then see its allocator once it uses CUDA. Never imports torch nor initialises CUDA
    itself. `history=True` records allocation sites (leak suspects by file:line), at a
    cost to the job (see the README). Returns this process's pid."""
    if _HOOK_DIR not in _sys.path:
        _sys.path.insert(0, _HOOK_DIR)
    import vramtop_hook

    try:
        # The hook already imported may be another version's (a `vramtop run` of another
        # binary put its folder first): a tidy-up it lacks is no reason to fail.
        _clear_stale_sockets(vramtop_hook.socket_dir())
    except Exception:
        pass
    vramtop_hook.start(history=history)
    return _os.getpid()


def step():
    """Mark the end of one step of this job (a decoding step, a training step without a
    torch optimizer) in the hook's history: at an OOM, `empty_cache() between steps` is
    replayed at each mark. Optimizer steps are marked by the hook itself. Does nothing
    where the hook is not running; never raises."""
    hook = _sys.modules.get("vramtop_hook")
    if hook is not None:
        try:
            hook.mark_step()
        except Exception:
            pass


def _clear_stale_sockets(directory):
    """Sockets left by processes that are gone (a notebook kernel killed by a restart):
    viewers would skip them anyway, but they should not pile up."""
    try:
        names = _os.listdir(directory)
    except OSError:
        return
    for name in names:
        if not (name.startswith("vramtop-") and name.endswith(".sock")):
            continue
        try:
            pid = int(name[len("vramtop-") : -len(".sock")])
        except ValueError:
            continue
        if pid == _os.getpid() or _alive(pid):
            continue
        try:
            _os.unlink(_os.path.join(directory, name))
        except OSError:
            pass


def _alive(pid):
    try:
        _os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: not ours to judge
    return True


def binary():
    """The `vramtop` command installed with this package, else the one on PATH; None when
    there is neither."""
    scripts = _sysconfig.get_path("scripts")
    beside = _os.path.join(scripts, "vramtop") if scripts else None
    if beside and _os.access(beside, _os.X_OK):
        return beside
    return _shutil.which("vramtop")


def status(pid=None, wait_s=3.0):
    """This process's allocator as `vramtop attach --json` reports it (a dict), or None
    with the reason printed, when no state came within `wait_s` seconds."""
    pid = _os.getpid() if pid is None else pid
    exe = binary()
    if exe is None:
        print("vramtop: the vramtop command is not installed here: install vramtop's wheel")
        return None
    try:
        out = _subprocess.run(
            [exe, "attach", "--json", "--pid", str(pid), "--seconds", str(wait_s), "--interval", "0.5"],
            capture_output=True, text=True, timeout=wait_s + 10,
        )
    except (OSError, _subprocess.TimeoutExpired) as err:
        print("vramtop: could not run %s: %s" % (exe, err))
        return None
    last = None
    for line in out.stdout.splitlines():
        try:
            attached = _json.loads(line).get("attached") or []
        except (ValueError, AttributeError):
            continue
        for entry in attached:
            if isinstance(entry, dict) and entry.get("pid") == pid and entry.get("states"):
                last = entry
    if last is None:
        reason = (out.stderr.strip().splitlines() or ["no state from pid %d" % pid])[-1]
        if reason.startswith("vramtop: "):  # (str.removeprefix needs Python 3.9)
            reason = reason[len("vramtop: "):]
        print("vramtop: %s" % reason)
    return last


def _summary(entry):
    """The few lines `%vramtop status` prints."""
    def size(value):
        if not isinstance(value, (int, float)):
            return "N/A"
        for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
            if value >= scale:
                return "%.1f %s" % (value / scale, unit)
        return "%d B" % value
    lines = [
        "vramtop: pid %s, device %s: reserved %s, allocated %s, largest free %s, fragmentation %s"
        % (
            entry.get("pid"), entry.get("device", "N/A"),
            size(entry.get("reserved_bytes")), size(entry.get("allocated_bytes")),
            size(entry.get("largest_free_bytes")),
            "%.2f" % entry["external_fragmentation"] if isinstance(entry.get("external_fragmentation"), (int, float)) else "N/A",
        )
    ]
    oom = entry.get("last_oom")
    if isinstance(oom, dict):
        lines.append("vramtop: last OOM: %s" % oom.get("line"))
        if oom.get("pytorch_summary"):
            lines.append("vramtop:   PyTorch: %s" % oom["pytorch_summary"])

    return "\n".join(lines)


def _magic(line):
    """%vramtop [status]"""
    words = line.split()
    if words[:1] == ["status"]:
        entry = status()
        if entry is not None:
            print(_summary(entry))
        return
    if words:
        print("vramtop: %%vramtop takes nothing or `status`, not %r" % line.strip())
        return
    if _importlib_util.find_spec("torch") is None:
        print("vramtop: torch is not installed in this kernel's Python; there is nothing to watch")
        return
    pid = start()
    exe = binary() or "vramtop"
    print("vramtop: hooked this kernel (pid %d); watch it with: %s   (or headless: %s attach --pid %d)" % (pid, exe, exe, pid))


def load_ipython_extension(ipython):
    """`%load_ext vramtop`: registers the `%vramtop` line magic."""
    ipython.register_magic_function(_magic, magic_kind="line", magic_name="vramtop")
