import torch.distributed as dist


def main():
    dist.init_process_group("gloo")  # expect: GD503
    dist.barrier()
