import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    try:
        dist.barrier()
    finally:
        dist.destroy_process_group()
