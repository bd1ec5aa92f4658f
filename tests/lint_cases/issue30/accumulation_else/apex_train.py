"""The same under apex's DistributedDataParallel (XLM's AMP path), whose optimizers are
stepped in a loop over them: the finding's detail names disable_allreduce(), not no_sync()
(tests/test_lint_judge18.py)."""

import apex
import torch
import torch.distributed as dist


class Trainer:
    def __init__(self, model, params):
        self.params = params
        self.model = apex.parallel.DistributedDataParallel(model.cuda(), delay_allreduce=True)
        self.optimizers = {"model": torch.optim.Adam(self.model.parameters())}
        self.n_iter = 0

    def optimize(self, loss):
        optimizers = list(self.optimizers.values())
        if self.n_iter % self.params.accumulate_gradients == 0:
            with apex.amp.scale_loss(loss, optimizers) as scaled_loss:
                scaled_loss.backward()
            for optimizer in optimizers:
                optimizer.step()
                optimizer.zero_grad()
        else:
            with apex.amp.scale_loss(loss, optimizers, delay_unscale=True) as scaled_loss:
                scaled_loss.backward()  # expect: GD602
        self.n_iter += 1


def main(params):
    torch.manual_seed(0)
    torch.cuda.set_device(params.local_rank)
    dist.init_process_group("nccl")
    trainer = Trainer(torch.nn.Linear(4, 4), params)
    for _ in range(100):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = trainer.model(torch.randn(8, 4, device="cuda")).sum()
        trainer.optimize(loss)
    dist.destroy_process_group()
