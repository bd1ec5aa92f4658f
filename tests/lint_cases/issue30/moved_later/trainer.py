"""Eighteenth judge, F2 (XLM's trainer): batches come from the project's own iterators the
linter cannot follow, but the step moves them with `to_cuda(...)` afterwards: what is read
before the move (an assert in the step, `concat_batches()` reading the lengths, also through
`generate_batch()` whose results the step moves) is host memory. Reads after the move sync
(the controls)."""

import torch
from utils import concat_batches, to_cuda


class Trainer:
    def __init__(self, model, data):
        self.model = model.cuda()
        self.data = data
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.stats = []

    def get_batch(self):
        return self.data.sample()

    def generate_batch(self):
        (x1, len1), (x2, len2) = self.get_batch()
        x, lengths = concat_batches(x1, len1, x2, len2)
        return x, lengths

    def step(self):
        x, lengths = self.generate_batch()
        y = x[1:].clone()
        assert (lengths - 1).sum().item() == y.size(0)
        x, lengths, y = to_cuda(x, lengths, y)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = self.model(x, lengths, y)
        self.stats.append(lengths.sum().item())  # expect: GD301
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()


def main(model, data):
    trainer = Trainer(model, data)
    for _ in range(100):
        trainer.step()
