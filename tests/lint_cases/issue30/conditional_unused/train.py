# Judge 20, M2: find_unused_parameters given as an expression that is True on some runs
# (SimCSE's copy of the Hugging Face Trainer; `not grad_ckpt`, judge 15): GD401, worded as
# conditional. A plain variable is the user's choice; an expression never True is silent.
import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from transformers import PreTrainedModel

parser = argparse.ArgumentParser()
parser.add_argument("--ckpt", action="store_true")
parser.add_argument("--unused", action="store_true")
args = parser.parse_args()
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
dist.init_process_group("nccl")
torch.manual_seed(0)
model = torch.nn.Linear(8, 8).cuda()
first = DDP(  # expect: GD401
    model,
    device_ids=[local_rank],
    find_unused_parameters=(
        not getattr(model.config, "gradient_checkpointing", False)
        if isinstance(model, PreTrainedModel)
        else True
    ),
)
second = DDP(model, device_ids=[local_rank], find_unused_parameters=not args.ckpt)  # expect: GD401
third = DDP(model, device_ids=[local_rank], find_unused_parameters=args.unused)
fourth = DDP(model, device_ids=[local_rank], find_unused_parameters=False if args.unused else False)
dist.destroy_process_group()
