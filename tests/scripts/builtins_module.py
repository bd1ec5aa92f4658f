"""The script uses __builtins__ as python gives it to __main__: the builtins module."""

import torch

_print = __builtins__.print


def quiet_print(*a, **k):
    _print(*a, **k)


__builtins__.print = quiet_print
model = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(4):
    opt.zero_grad()
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
print("BUILTINS_MODULE_DONE", type(__builtins__).__name__)
