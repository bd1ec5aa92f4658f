# wenet's datasets (fifteenth judge): a datapipe that takes its rank's slice itself, built
# by a factory *function* and rebound through chained calls before it is returned.
import torch.distributed as dist
from torch.utils.data import IterDataPipe


class ListSource(IterDataPipe):
    def __init__(self, files, partition=True):
        rank, world = dist.get_rank(), dist.get_world_size()
        self.files = files[rank::world] if partition else files

    def __iter__(self):
        for name in self.files:
            with open(name) as f:
                yield from f


def Dataset(files, partition=True):
    dataset = ListSource(files, partition)
    dataset = dataset.map(str.strip)
    return dataset
