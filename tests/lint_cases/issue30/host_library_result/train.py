# Judge 21, F1 and F2: a value is on the GPU only if something put it there.
# F1: a function of another package called on host batch fields returns host memory
# (icefall's `encode_supervisions(batch["supervisions"], ...)`: torch.stack of lhotse's CPU
# fields); a project helper that moves nothing is host too; a helper named for a device, a
# device argument or a model's output stays a device tensor.
# F2: `feature.size(2)`, `x.shape[1]`, `len(x)` are Python ints, even of a device tensor.
import torch
import torch.distributed as dist
from lhotse.dataset import collate_lengths
from somelib.utils import batch_to_device, encode_supervisions
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader


def lengths_of(supervisions):
    return torch.as_tensor([len(s) for s in supervisions["text"]])


def train(model, loader, optimizer, device, params):
    for batch in loader:
        feature = batch["inputs"].to(device, non_blocking=True)
        supervisions = batch["supervisions"]
        segments, texts = encode_supervisions(supervisions, subsampling_factor=params.factor)
        lengths = collate_lengths(batch["cuts"])
        own = lengths_of(supervisions)
        moved = batch_to_device(supervisions, device)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(feature)
            loss = out.sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        frames = segments[:, 2].sum().item()
        total = lengths.sum().item()
        words = own.sum().item()
        pad = ((feature.size(2) - supervisions["num_frames"]) / feature.size(2)).sum().item()
        ratio = (supervisions["num_frames"] * len(texts) / feature.shape[1]).mean().item()
        gpu = moved["num_frames"].sum().item()  # expect: GD301
        scaled = (feature.size(2) - out).sum().item()  # expect: GD301
        print(frames, total, words, pad, ratio, gpu, scaled)  # expect: GD702


def main(rank, dataset, params):
    torch.manual_seed(0)
    dist.init_process_group("nccl", rank=rank, world_size=2)
    torch.cuda.set_device(rank)
    model = DDP(torch.nn.Linear(80, 10).cuda(rank), device_ids=[rank])
    sampler = torch.utils.data.distributed.DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=8, num_workers=4, pin_memory=True, sampler=sampler)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        train(
            model,
            loader,
            torch.optim.SGD(model.parameters(), lr=0.1),
            torch.device("cuda", rank),
            params,
        )
    dist.destroy_process_group()
