# improved-diffusion's dist_util: the rank's CUDA device is built here, not in the script.
import os

import torch


def dev():
    return torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}")
