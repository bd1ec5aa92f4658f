"""An `accelerate` training loop on CPU (gloo DDP), a tiny GPT-2 built from a config.

    gpudiag trace --nproc-per-node 2 tests/frameworks/accelerate_loop.py --inject grad_accum_no_sync

--inject grad_accum: accumulation the documented way (`with accelerator.accumulate(model)`,
no all-reduce on the non-final micro-steps). --inject grad_accum_no_sync: the same
accumulation written by hand, without accumulate()/no_sync (an all-reduce every micro-step).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from _common import LazyOpen, SlowCollate, StepLog, busy_wait, inject_ms, parser  # noqa: E402
from accelerate import Accelerator  # noqa: E402
from torch.utils.data import DataLoader, Dataset, default_collate  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402


class TokenSet(LazyOpen, Dataset):
    def __init__(self, n, seq=64, vocab=1000):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, seq), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        self._maybe_open()
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main():
    args = parser(__doc__).parse_args()
    accum = args.accum if args.inject in ("grad_accum", "grad_accum_no_sync") else 1
    accelerator = Accelerator(
        cpu=True, gradient_accumulation_steps=accum if args.inject == "grad_accum" else 1
    )
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=128, n_head=2, vocab_size=1000, n_positions=128)
    model = GPT2LMHeadModel(cfg)
    micro = args.steps * accum
    ds = TokenSet(micro * args.batch_size * 2)
    collate, workers = default_collate, 0
    if args.inject == "slow_data_rank":
        collate = SlowCollate(default_collate, inject_ms(args), args.slow_rank)
    if args.inject == "startup_wait":
        ds.startup_s = inject_ms(args) / 1000.0
        workers = 1
    dl = DataLoader(
        ds,
        batch_size=args.batch_size,
        shuffle=True,
        collate_fn=collate,
        num_workers=workers,
        persistent_workers=workers > 0,
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt, dl = accelerator.prepare(model, opt, dl)
    log = StepLog(args.timing_dir)
    model.train()
    for i, batch in enumerate(dl):
        if i >= micro:
            break
        if args.inject == "grad_accum":
            with accelerator.accumulate(model):
                loss = model(**batch).loss
                accelerator.backward(loss)
                opt.step()
                opt.zero_grad()
            if accelerator.sync_gradients:
                log.step()
            continue
        if args.inject == "slow_compute_rank" and accelerator.process_index == args.slow_rank:
            busy_wait(inject_ms(args))
        loss = model(**batch).loss / accum
        accelerator.backward(loss)
        if (i + 1) % accum == 0:
            opt.step()
            opt.zero_grad()
            log.step()
    log.dump(rank=accelerator.process_index)
    accelerator.end_training()


if __name__ == "__main__":
    main()
