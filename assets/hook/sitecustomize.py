"""vramtop's bootstrap, loaded by Python at start-up because its directory is on PYTHONPATH.

It costs a job that never imports torch nearly nothing: no thread, no socket, no import of
the hook itself. It only puts a watcher at the head of sys.meta_path that notices the first
`import torch` and then starts the hook (vramtop_hook.py, beside this file). Then it runs the
`sitecustomize` the user already had (the next one on sys.path), under its own name, so
their start-up code still runs. VRAMTOP_HOOK=0 turns the hook off; see PROTOCOL.md.
Python 3.8+, stdlib only. Nothing here may raise into the job except the user's own
sitecustomize, whose errors Python reports as it would without us.
"""

import os as _os
import sys as _sys


class _TorchImportWatch:
    """A meta-path finder that finds nothing: it only notices that torch is being imported.

    Removing ourselves from sys.meta_path during an import would skip the next finder (the
    import machinery iterates the live list), so after firing it stays, answering None.
    """

    armed = True

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if cls.armed and name == "torch":
            cls.armed = False
            try:
                import vramtop_hook

                # If torch turns out not to be importable, the hook re-arms us.
                vramtop_hook.start(on_give_up=cls.rearm, torch_grace_s=10.0)
            except Exception:
                pass
        return None

    @classmethod
    def rearm(cls):
        cls.armed = True

    @classmethod
    def invalidate_caches(cls):
        pass


def _install_torch_watch():
    if _os.environ.get("VRAMTOP_HOOK", "1").strip() == "0":
        return
    if "torch" in _sys.modules:  # imported by something before us (rare at start-up)
        import vramtop_hook

        vramtop_hook.start()
        return
    _sys.meta_path.insert(0, _TorchImportWatch)


def _find_user_sitecustomize():
    """The spec of the next `sitecustomize` on sys.path after our own directory, or None."""
    import importlib.machinery

    here = _os.path.realpath(_os.path.dirname(_os.path.abspath(__file__)))

    def is_here(entry):
        try:
            return _os.path.realpath(entry or ".") == here
        except (OSError, ValueError, TypeError):
            return False

    entries = [p for p in _sys.path if isinstance(p, str)]
    ours = [i for i, p in enumerate(entries) if is_here(p)]
    after = entries[ours[0] + 1 :] if ours else entries
    # Our directory may be listed twice; never find ourselves again (that would recurse).
    rest = [p for p in after if not is_here(p)]
    return importlib.machinery.PathFinder.find_spec("sitecustomize", rest)


def _run_user_sitecustomize():
    try:
        spec = _find_user_sitecustomize()
    except Exception:
        return
    if spec is None or spec.loader is None:
        return
    import importlib.util

    module = importlib.util.module_from_spec(spec)
    # The user's module takes the name: after this file finishes, the import system hands
    # out sys.modules["sitecustomize"], which is then theirs, as without vramtop.
    _sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


try:
    _install_torch_watch()
except Exception:
    pass
_run_user_sitecustomize()
