"""vramtop's bootstrap, loaded by Python at start-up because its directory is on PYTHONPATH.

It costs a job that never imports torch nearly nothing: no thread, no socket, no import of
the hook itself. It only puts a watcher at the head of sys.meta_path that notices the first
`import torch` and, when that import has finished, starts the hook (the vramtop_hook
package, beside this file). Then it runs the
`sitecustomize` the user already had (the next one on sys.path), under its own name, so
their start-up code still runs. VRAMTOP_HOOK=0 turns the hook off; see PROTOCOL.md.
Python 3.8+, stdlib only. Nothing here may raise into the job except the user's own
sitecustomize, whose errors Python reports as it would without us.
"""

import os as _os
import sys as _sys


class _TorchImportWatch:
    """A meta-path finder that notices `import torch` and starts the hook when it is done.

    It finds torch's real spec through the other finders and hands it back with a loader
    that runs torch's own loader, then starts the hook in the importing thread: the hook
    is armed before the job's next line (its first CUDA call) runs. Removing ourselves
    from sys.meta_path during an import would skip the next finder (the import machinery
    iterates the live list), so we stay, answering None to every other name.
    """

    armed = True

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if not cls.armed or name != "torch":
            return None
        cls.armed = False  # also keeps our own search below from finding us
        try:
            spec = _find_spec_elsewhere(cls, name, path, target)
        except Exception:
            spec = None
            _start_polling()  # another finder failed us: let the hook watch sys.modules
        if spec is None:
            cls.armed = True  # no torch here: look again at the next `import torch`
            return None
        if not hasattr(spec.loader, "exec_module"):
            _start_polling()  # an old-style loader we cannot follow
            return None
        spec.loader = _ThenStartHook(spec.loader)
        return spec

    @classmethod
    def invalidate_caches(cls):
        pass


def _start_polling():
    try:
        import vramtop_hook

        vramtop_hook.start()
    except Exception:
        pass


def _find_spec_elsewhere(us, name, path, target):
    for finder in list(_sys.meta_path):
        find_spec = getattr(finder, "find_spec", None)
        if finder is us or find_spec is None:
            continue
        spec = find_spec(name, path, target)
        if spec is not None:
            return spec
    return None


class _ThenStartHook:
    """Torch's loader, plus: start vramtop's hook once torch's import has finished."""

    def __init__(self, loader):
        self.loader = loader

    def __getattr__(self, attr):
        return getattr(self.loader, attr)

    def create_module(self, spec):
        create = getattr(self.loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module):
        # Torch sees its own loader, as without us.
        try:
            module.__spec__.loader = self.loader
            module.__loader__ = self.loader
        except Exception:
            pass
        try:
            self.loader.exec_module(module)
        except BaseException:
            _TorchImportWatch.armed = True
            raise
        try:
            import vramtop_hook

            vramtop_hook.torch_imported(module)
        except Exception:
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
