"""Hand-written causal-LM fine-tuning with DDP and gradient accumulation."""

import logging
import math
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from transformers import AutoModelForCausalLM, AutoTokenizer

logger = logging.getLogger(__name__)
logging.basicConfig(level=logging.INFO)  # every rank logs at INFO

GRAD_ACCUM_STEPS = 8
LOG_EVERY = 50


class TokenBlocks(Dataset):
    def __init__(self, path, tokenizer, block_size=1024):
        with open(path) as handle:
            ids = tokenizer(handle.read())["input_ids"]
        self.blocks = [ids[i : i + block_size] for i in range(0, len(ids) - block_size, block_size)]

    def __len__(self):
        return len(self.blocks)

    def __getitem__(self, index):
        return torch.tensor(self.blocks[index])


def train_step(model, batch, optimizer, step):
    logits = model(batch[:, :-1]).logits
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))
    (loss / GRAD_ACCUM_STEPS).backward()  # expect: GD602
    if (step + 1) % GRAD_ACCUM_STEPS == 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="gloo")  # expect: GD501 GD503
    torch.manual_seed(1234)

    tokenizer = AutoTokenizer.from_pretrained("gpt2")
    model = AutoModelForCausalLM.from_pretrained("gpt2", torch_dtype=torch.bfloat16)
    model = DDP(model, device_ids=[local_rank])
    model.to(f"cuda:{local_rank}")  # expect: GD402

    dataset = TokenBlocks("train.txt", tokenizer)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=4, sampler=sampler, num_workers=4, pin_memory=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5)

    for epoch in range(3):
        sampler.set_epoch(epoch)
        for step, batch in enumerate(loader):
            batch = batch.cuda(non_blocking=True)
            loss = train_step(model, batch, optimizer, step)
            dist.all_reduce(loss)  # expect: GD704
            if step % LOG_EVERY == 0 and dist.get_rank() == 0:
                logger.info(
                    "epoch %d step %d loss %.3f ppl %.1f",
                    epoch,
                    step,
                    loss.item(),
                    math.exp(loss.item()),
                )
            logger.info("step %d done", step)  # expect: GD702
        if dist.get_rank() == 0:
            model.module.save_pretrained(f"checkpoint-{epoch}")


if __name__ == "__main__":
    main()
