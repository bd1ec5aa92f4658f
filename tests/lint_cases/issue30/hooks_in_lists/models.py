"""Twenty-first judge, M2: hooks registered through a literal list or tuple run with the
module's forward (or backward), so their syncs are per-step code where the module trains.
Shapes: a backbone keeping block outputs for a feature loss (the hook stores a tensor: no
sync), a finiteness check handed in with functools.partial, per-block statistics."""

from functools import partial

import torch


def check_finite(module, inputs, output, name):
    assert output.isfinite().all().item(), name  # expect: GD301


class Backbone(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Linear(4, 8)
        self.block1 = torch.nn.Linear(8, 8)
        self.block2 = torch.nn.Linear(8, 4)
        self.features = {}
        self.stats = []
        for m in [self.block1, self.block2]:
            m.register_forward_hook(self._keep)
        for m in (self.block1,):
            m.register_forward_hook(self._record)
        self.stem.register_forward_hook(partial(check_finite, name="stem"))

    def _keep(self, module, inputs, output):
        self.features[id(module)] = output

    def _record(self, module, inputs, output):
        self.stats.append(output.abs().mean().item())  # expect: GD301

    def forward(self, x):
        return self.block2(self.block1(self.stem(x)))


class Probe(torch.nn.Module):
    """Never run by a step loop: its hook is not per-step code (the control)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        for m in [self.lin]:
            m.register_forward_hook(self._peek)

    def _peek(self, module, inputs, output):
        print(output.sum().item())

    def forward(self, x):
        return self.lin(x)
