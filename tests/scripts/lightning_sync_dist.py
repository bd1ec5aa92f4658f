"""A tiny Lightning Trainer (2 ranks, gloo, CPU) that logs its loss with sync_dist=True
every step: one small all_reduce of a scalar per step issued by Lightning itself, besides
its own per-step 8-byte SIGTERM-flag broadcast and DDP's gradient buckets (issue 29,
class 1: tiny framework collectives costed as gradient transfer).

    gpudiag trace --nproc-per-node 2 tests/scripts/lightning_sync_dist.py --steps 30
"""

import argparse

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Model(L.LightningModule):
    def __init__(self, sync_dist: bool) -> None:
        super().__init__()
        self.sync_dist = sync_dist
        self.net = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, sync_dist=self.sync_dist, on_step=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--no-sync-dist", action="store_true")
    args = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    n = args.steps * 16 * 2
    ds = TensorDataset(torch.randn(n, 256, generator=g), torch.randint(0, 10, (n,), generator=g))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_steps=args.steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=1,
    )
    trainer.fit(Model(not args.no_sync_dist), DataLoader(ds, batch_size=16))


if __name__ == "__main__":
    main()
