"""A SIMULATED stand-in for `torch`, for the hook's tests (CI has no torch, no GPU).

It has only what vramtop_hook touches, behaving as PyTorch's CUDA caching allocator does
as seen from Python: is_initialized, memory_stats, memory_snapshot/_snapshot, the OOM
observer, _record_memory_history. Like the real binding, attaching an OOM observer or
turning history on initialises "CUDA", so a test can catch a hook that does either early.
STUB_TORCH_LACKS (comma-separated: memory_snapshot, memory_stats, oom_observer,
record_memory_history, allocator_settings, clear_history, skip_actions) removes APIs to
play an older PyTorch.
"""

__version__ = "2.11.0+stub"


class OutOfMemoryError(RuntimeError):
    pass


from . import _C  # noqa: E402
from . import cuda  # noqa: E402
from . import optim  # noqa: E402
from . import amp  # noqa: E402
