"""The stub's torch.amp: a GradScaler whose step() runs the optimizer's step unless the
gradients had infs (`found_inf`), as torch.amp.GradScaler does."""


class GradScaler:
    def __init__(self, enabled=True):
        self.enabled = enabled
        self.found_inf = False

    def step(self, optimizer, *args, **kwargs):
        if not self.enabled or not self.found_inf:
            return optimizer.step(*args, **kwargs)
        return None  # skipped: the optimizer's step is not run
