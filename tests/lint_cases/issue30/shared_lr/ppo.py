"""rsl_rl's PPO: the KL-adaptive learning rate. Every rank must step with the same lr, so
the mean KL is all-reduced, tested on the host and the new lr broadcast from rank 0 before
it is written into the optimizer's param_groups: required for correctness, not avoidable
per-step overhead. A metric reduced next to it in the same step is still reported."""

import torch
import torch.distributed as dist


class PPO:
    def __init__(self, policy, storage, learning_rate=1e-3, desired_kl=0.01, multi_gpu=None):
        self.policy = policy
        self.storage = storage
        self.learning_rate = learning_rate
        self.desired_kl = desired_kl
        self.schedule = "adaptive"
        self.is_multi_gpu = multi_gpu is not None
        self.gpu_global_rank = multi_gpu["global_rank"] if multi_gpu else 0
        self.gpu_world_size = multi_gpu["world_size"] if multi_gpu else 1
        self.device = "cuda"
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=learning_rate)

    def update(self):
        mean_loss = 0.0
        for obs, actions, old_mu, old_sigma, advantages in self.storage.mini_batch_generator():
            self.policy.act(obs)
            mu, sigma = self.policy.action_mean, self.policy.action_std
            if self.desired_kl is not None and self.schedule == "adaptive":
                with torch.inference_mode():
                    kl = torch.sum(
                        torch.log(sigma / old_sigma + 1.0e-5)
                        + (old_sigma.pow(2) + (old_mu - mu).pow(2)) / (2.0 * sigma.pow(2))
                        - 0.5,
                        dim=-1,
                    )
                    kl_mean = torch.mean(kl)
                    if self.is_multi_gpu:
                        dist.all_reduce(kl_mean, op=dist.ReduceOp.SUM)
                        kl_mean /= self.gpu_world_size
                    if self.gpu_global_rank == 0:
                        if kl_mean > self.desired_kl * 2.0:
                            self.learning_rate = max(1e-5, self.learning_rate / 1.5)
                        elif kl_mean < self.desired_kl / 2.0 and kl_mean > 0.0:
                            self.learning_rate = min(1e-2, self.learning_rate * 1.5)
                    if self.is_multi_gpu:
                        lr_tensor = torch.tensor(self.learning_rate, device=self.device)
                        dist.broadcast(lr_tensor, src=0)
                        self.learning_rate = lr_tensor.item()
                    for param_group in self.optimizer.param_groups:
                        param_group["lr"] = self.learning_rate
            loss = (advantages * self.policy.get_actions_log_prob(actions)).mean()
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            reduced = loss.detach()
            dist.all_reduce(reduced)  # expect: GD704
            mean_loss += reduced.item()  # expect: GD301
        return mean_loss


def kl_adaptive(optimizer, loader, model, lr, desired_kl, world):
    for x, old_logits in loader:
        logits = model(x.cuda(non_blocking=True))
        kl = torch.nn.functional.kl_div(logits.log_softmax(-1), old_logits.cuda().softmax(-1))
        kl_mean = kl.mean()
        dist.all_reduce(kl_mean)
        kl_mean /= world
        if kl_mean > desired_kl * 2:
            lr = max(1e-5, lr / 1.5)
        for g in optimizer.param_groups:
            g["lr"] = lr
        kl.backward()
        optimizer.step()


def main():
    dist.init_process_group("nccl")
    torch.cuda.set_device(0)
    torch.manual_seed(0)
    policy = torch.nn.Linear(8, 2).cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        PPO(policy, storage=None, multi_gpu={"global_rank": 0, "world_size": 2}).update()
    dist.destroy_process_group()
