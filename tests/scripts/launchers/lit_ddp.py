"""A plain Lightning script: Trainer(devices=N, strategy="ddp", accelerator="cpu").
Lightning's own launcher (_SubprocessScriptLauncher) runs this script again for ranks
1..N-1. Traced by tests/test_launchers.py as
`gpudiag trace lit_ddp.py [STEPS] [DEVICES] [ROOT_DIR] [FAIL_RANK]`."""

import sys

import lightning as L
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Model(L.LightningModule):
    def __init__(self, fail_rank: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))
        self.fail_rank = fail_rank

    def training_step(self, batch, batch_idx):
        if self.global_rank == self.fail_rank and batch_idx == 3:
            raise RuntimeError(f"injected failure on rank {self.global_rank}")
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    devices = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    root = sys.argv[3] if len(sys.argv) > 3 else "lightning_root"
    fail_rank = int(sys.argv[4]) if len(sys.argv) > 4 else -1
    torch.manual_seed(0)
    data = TensorDataset(
        torch.randn(64 * devices * steps, 32), torch.randn(64 * devices * steps, 8)
    )
    trainer = L.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy="ddp",
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
    )
    trainer.fit(Model(fail_rank), DataLoader(data, batch_size=64))


if __name__ == "__main__":
    main()
