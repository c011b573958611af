"""torch.optim.optimizer as the hook sees it: global post-step hooks, and an Optimizer."""

_global_post_hooks = []


def register_optimizer_step_post_hook(hook):
    _global_post_hooks.append(hook)


class Optimizer:
    def step(self):
        for hook in list(_global_post_hooks):
            hook(self, (), {})
