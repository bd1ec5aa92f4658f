"""univnet-style launcher: seeds, then spawns the worker defined in utils/train.py."""

import argparse

import torch
import torch.multiprocessing as mp
from utils.train import train

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args()
    torch.manual_seed(args.seed)  # expect: GD405
    num_gpus = torch.cuda.device_count()
    mp.spawn(train, nprocs=num_gpus, args=(num_gpus, args.seed))
