"""FastSpeech2 / Tacotron style: helpers build masks and buckets from the lengths while the
batch is still on the host, before `to_cuda(...)` / `.cuda()` moves it: their `.item()` /
`.tolist()` read host memory, no device sync. The same helper called on the moved batch
syncs (the control)."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def to_cuda(*tensors):
    return [t.cuda(non_blocking=True) for t in tensors]


def get_mask_from_lengths(lengths):
    max_len = lengths.max().item()
    ids = torch.arange(0, max_len).unsqueeze(0).expand(lengths.size(0), -1)
    return ids >= lengths.unsqueeze(1)


def longest(lengths):
    return max(lengths.tolist())


def log_lengths(lengths):
    return lengths.float().mean().item()  # expect: GD301


class Trainer:
    def __init__(self, model, loader, optimizer):
        self.model = model
        self.loader = loader
        self.optimizer = optimizer

    def prepare(self, batch):
        batch["max_src_len"] = batch["src_lens"].max().item()
        batch["max_mel_len"] = int(batch["mel_lens"].max())
        return batch

    def step(self, batch):
        batch = self.prepare(batch)
        batch = {
            k: v.cuda(non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()
        }
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = self.model(**batch)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()

    def fit(self):
        for batch in self.loader:
            self.step(batch)


def train(rank, model, loader, optimizer):
    dist.init_process_group("nccl")
    torch.cuda.set_device(rank)
    torch.manual_seed(0)
    model = DDP(model.cuda(rank), device_ids=[rank])
    for epoch in range(10):
        loader.sampler.set_epoch(epoch)
        for texts, text_lens, mels, mel_lens in loader:
            src_mask = get_mask_from_lengths(text_lens)
            mel_mask = get_mask_from_lengths(mel_lens)
            width = longest(mel_lens)
            texts, text_lens, mels, mel_lens = to_cuda(texts, text_lens, mels, mel_lens)
            src_mask, mel_mask = src_mask.cuda(), mel_mask.cuda()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(texts, src_mask, mels[:, :width], mel_mask)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            log_lengths(mel_lens)
    dist.destroy_process_group()
