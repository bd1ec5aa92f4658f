from torch.utils.data import DistributedSampler


def samplers(dataset):
    a = DistributedSampler(dataset, num_replicas=4, rank=0, shuffle=False)  # expect: GD207
    b = DistributedSampler(dataset, num_replicas=1, shuffle=False)  # expect: GD207
    return a, b
