def truncate(x, lengths, max_len):
    if lengths.max().item() > max_len:
        x = x[:max_len]
        lengths = lengths.clamp(max=max_len)
    return x, lengths


def to_cuda(*args):
    return [a.cuda() for a in args]
