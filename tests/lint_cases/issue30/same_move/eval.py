# awesome-semantic-segmentation's scripts/eval.py (thirteenth judge): the model is moved
# to the device, wrapped, then moved to the same device again: a no-op, not GD402.
import os

import torch
import torch.distributed as dist


class Evaluator:
    def __init__(self):
        dist.init_process_group("nccl")  # expect: GD503
        self.rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(self.rank)
        torch.manual_seed(0)
        self.device = torch.device("cuda", self.rank)
        self.model = torch.nn.Linear(8, 8).to(self.device)
        self.model = torch.nn.parallel.DistributedDataParallel(self.model, device_ids=[self.rank])
        self.model.to(self.device)
        self.model.half()  # expect: GD402

    def run(self):
        with torch.no_grad():
            return self.model(torch.randn(8, 8, device=self.device))
