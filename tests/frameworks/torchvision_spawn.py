"""A torchvision-style ImageNet-like script: it starts its own workers with
torch.multiprocessing.spawn and trains a ResNet with DDP on gloo (CPU), on FakeData-like
synthetic images. Run it as a single process:

    gpudiag trace tests/frameworks/torchvision_spawn.py --inject slow_compute_rank

The model is torchvision.models.resnet18(weights=None) when torchvision imports; otherwise
(no torchvision, or a torchvision wheel whose C extension does not match this torch) a small
local ResNet of the same BasicBlock design, so the suite runs either way.
"""

import os
import socket
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from _common import LazyOpen, SlowCollate, StepLog, busy_wait, inject_ms, parser  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from torch.utils.data import DataLoader, Dataset, default_collate  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402

WORLD = 2


class FakeImages(LazyOpen, Dataset):
    """Like torchvision.datasets.FakeData: random images and labels, made on the fly."""

    def __init__(self, n, size=(3, 32, 32), classes=10):
        self.n, self.size, self.classes = n, size, classes

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self._maybe_open()
        g = torch.Generator().manual_seed(i)
        return torch.randn(self.size, generator=g), int(
            torch.randint(0, self.classes, (1,), generator=g)
        )


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        y = self.b2(self.c2(y))
        return torch.relu(y + (x if self.down is None else self.down(x)))


def small_resnet(classes=10, widths=(16, 32, 64, 128)):
    layers, cin = (
        [nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU()],
        widths[0],
    )
    for i, w in enumerate(widths):
        layers.append(Block(cin, w, 1 if i == 0 else 2))
        cin = w
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


def build_model():
    try:
        import torchvision

        return torchvision.models.resnet18(weights=None, num_classes=10), "torchvision.resnet18"
    except Exception:  # ImportError, or RuntimeError from a mismatched torchvision wheel
        return small_resnet(), "local small ResNet"


def worker(rank, args, port):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)  # as torchrun does (OMP_NUM_THREADS=1): 2 workers, few cores
    torch.manual_seed(0)
    model, name = build_model()
    if rank == 0:
        print(f"model: {name}", flush=True)
    model = DDP(model)
    accum = args.accum if args.inject in ("grad_accum", "grad_accum_no_sync") else 1
    micro = args.steps * accum
    ds = FakeImages(micro * args.batch_size * WORLD)
    collate, workers = default_collate, 0
    if args.inject == "slow_data_rank":
        collate = SlowCollate(default_collate, inject_ms(args), args.slow_rank)
    if args.inject == "startup_wait":
        ds.startup_s = inject_ms(args) / 1000.0
        workers = 1
    loader = DataLoader(
        ds,
        batch_size=args.batch_size,
        sampler=DistributedSampler(ds),
        collate_fn=collate,
        num_workers=workers,
        persistent_workers=workers > 0,
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    crit = nn.CrossEntropyLoss()
    log = StepLog(args.timing_dir)
    model.train()
    for i, (x, y) in enumerate(loader):
        if args.inject == "slow_compute_rank" and rank == args.slow_rank:
            busy_wait(inject_ms(args))
        last = (i + 1) % accum == 0
        if args.inject == "grad_accum" and not last:
            with model.no_sync():
                (crit(model(x), y) / accum).backward()
        else:
            (crit(model(x), y) / accum).backward()
        if last:
            opt.step()
            opt.zero_grad()
            log.step()
    log.dump(rank=rank)
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    args = parser(__doc__).parse_args()
    mp.spawn(worker, args=(args, free_port()), nprocs=WORLD, join=True)


if __name__ == "__main__":
    main()
