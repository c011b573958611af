"""The stub's torch.optim: an optimizer whose step() runs the global post-step hooks, as
torch.optim.Optimizer does (register_optimizer_step_post_hook)."""

from .optimizer import Optimizer  # noqa: F401

# As torch/optim/__init__.py does: the module is reached through sys.modules only.
del optimizer  # noqa: F821
