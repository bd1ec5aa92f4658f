"""Evaluation called every N steps and nanoGPT-style accumulation: no per-step host sync."""

import torch


class Trainer:
    def estimate_loss(self):
        losses = torch.zeros(10)
        for k in range(10):
            _, loss = self.model(*self.get_batch())
            losses[k] = loss.item()
        return losses.mean()

    def get_batch(self):
        x = torch.randint(100, (8, 16))
        return x.pin_memory().to("cuda", non_blocking=True), x.pin_memory().to(
            "cuda", non_blocking=True
        )

    def train(self):
        while True:
            if self.iter_num % 100 == 0:
                print(self.estimate_loss())
            for micro_step in range(4):
                self.model.require_backward_grad_sync = micro_step == 3
                with torch.autocast("cuda"):
                    _, loss = self.model(*self.get_batch())
                self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.iter_num += 1
