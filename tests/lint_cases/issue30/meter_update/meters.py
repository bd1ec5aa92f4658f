class AverageMeter:
    """msn's meter: max() / min() take the truth of `val > self.max`, a host read."""

    def __init__(self):
        self.max = float("-inf")
        self.sum = 0
        self.count = 0

    def update(self, val, n=1):
        self.max = max(val, self.max)
        self.sum += val * n
        self.count += n


class BestMeter:
    def __init__(self):
        self.best = None

    def update(self, val):
        if self.best is None or val > self.best:
            self.best = val


class SumMeter:
    """Only arithmetic: the sum stays a tensor on the GPU, nothing is read."""

    def __init__(self):
        self.sum = 0

    def update(self, val):
        self.sum += val
