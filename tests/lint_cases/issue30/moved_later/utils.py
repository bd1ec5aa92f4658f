import torch


def concat_batches(x1, len1, x2, len2):
    lengths = len1 + len2
    x = torch.cat([x1[: len1.max().item()], x2], 0)
    return x, lengths


def to_cuda(*args):
    return [None if x is None else x.cuda() for x in args]
