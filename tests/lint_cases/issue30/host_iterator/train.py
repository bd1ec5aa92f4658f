"""Eighteenth judge, F2 (XLM): a batch drawn with `next(iterator)` from the project's own
generator of `torch.LongTensor`s is host memory until `to_cuda(...)` moves it: the lengths
read in `truncate()` before the move sync nothing. The same helper on the moved lengths
syncs (the control)."""

import torch
from utils import to_cuda, truncate


def get_iterator(data, bs):
    for i in range(0, len(data), bs):
        x = data[i : i + bs]
        yield x, torch.LongTensor([len(s) for s in x])


def main(data):
    model = torch.nn.Linear(4, 4).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    iterator = get_iterator(data, 8)
    while True:
        try:
            batch = next(iterator)
        except StopIteration:
            break
        x, lengths = batch
        x, lengths = truncate(x, lengths, 256)
        x, lengths = to_cuda(x, lengths)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(lengths.max().item())  # expect: GD301
