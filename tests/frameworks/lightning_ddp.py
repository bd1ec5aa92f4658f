"""Lightning DDP on CPU, run under torchrun / `gpudiag trace --nproc-per-node 2`.

gpudiag trace --nproc-per-node 2 tests/frameworks/lightning_ddp.py --inject slow_compute_rank
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import lightning as L  # noqa: E402
import torch  # noqa: E402
from _common import LazyOpen, SlowCollate, StepLog, busy_wait, inject_ms, parser  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, Dataset, default_collate  # noqa: E402


class RandomSet(LazyOpen, Dataset):
    def __init__(self, n, dim=256, classes=10):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, dim, generator=g)
        self.y = torch.randint(0, classes, (n,), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        self._maybe_open()
        return self.x[i], self.y[i]


class Classifier(L.LightningModule):
    def __init__(self, args):
        super().__init__()
        self.args = args
        self.net = nn.Sequential(
            nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        if self.args.inject == "slow_compute_rank" and self.global_rank == self.args.slow_rank:
            busy_wait(inject_ms(self.args))
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Timing(L.Callback):
    def __init__(self, log):
        self.steplog = log

    def on_train_batch_end(self, trainer, *a, **k):
        self.steplog.step()

    def on_train_end(self, trainer, pl_module):
        self.steplog.dump(rank=trainer.global_rank)


def main():
    args = parser(__doc__).parse_args()
    torch.manual_seed(0)
    ds = RandomSet(args.steps * args.batch_size * 2)
    workers = 0
    collate = default_collate
    if args.inject == "slow_data_rank":
        collate = SlowCollate(default_collate, inject_ms(args), args.slow_rank)
    if args.inject == "startup_wait":
        ds.startup_s = inject_ms(args) / 1000.0
        workers = 1
    dl = DataLoader(
        ds,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=workers,
        persistent_workers=workers > 0,
        collate_fn=collate,
    )
    trainer = L.Trainer(
        accelerator="gpu" if args.gpu else "cpu",
        devices=int(os.environ.get("WORLD_SIZE", "2")) if args.gpu else 2,
        strategy="ddp",
        max_steps=args.steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Timing(StepLog(args.timing_dir))],
    )
    trainer.fit(Classifier(args), dl)


if __name__ == "__main__":
    main()
