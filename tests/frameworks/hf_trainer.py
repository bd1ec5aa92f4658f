"""Hugging Face `Trainer` on CPU (gloo DDP), a tiny GPT-2 built from a config.

gpudiag trace --nproc-per-node 2 tests/frameworks/hf_trainer.py --inject slow_data_rank
"""

import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from _common import LazyOpen, SlowCollate, StepLog, busy_wait, inject_ms, parser  # noqa: E402
from torch.utils.data import Dataset  # noqa: E402
from transformers import (  # noqa: E402
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    default_data_collator,
)


class TokenSet(LazyOpen, Dataset):
    def __init__(self, n, seq=64, vocab=1000):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, seq), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        self._maybe_open()
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class SlowRankTrainer(Trainer):
    """A user's Trainer subclass doing extra work on one rank (e.g. a rank-0-only metric)."""

    def __init__(self, *a, busy_ms=0.0, slow_rank=1, **k):
        super().__init__(*a, **k)
        self.busy_ms, self.slow_rank = busy_ms, slow_rank

    def compute_loss(self, model, inputs, *a, **k):
        if self.busy_ms and self.args.process_index == self.slow_rank:
            busy_wait(self.busy_ms)
        return super().compute_loss(model, inputs, *a, **k)


class Timing(TrainerCallback):
    def __init__(self, log):
        self.steplog = log

    def on_step_end(self, args, state, control, **kw):
        self.steplog.step()

    def on_train_end(self, args, state, control, **kw):
        self.steplog.dump(rank=args.process_index)


def main():
    args = parser(__doc__).parse_args()
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=1000, n_positions=128)
    model = GPT2LMHeadModel(cfg)
    ds = TokenSet(args.steps * args.batch_size * 2)
    collator = default_data_collator
    workers = 0
    if args.inject == "slow_data_rank":
        collator = SlowCollate(default_data_collator, inject_ms(args), args.slow_rank)
    if args.inject == "startup_wait":
        ds.startup_s = inject_ms(args) / 1000.0
        workers = 1
    out = tempfile.mkdtemp(prefix="hf_trainer_")
    targs = TrainingArguments(
        output_dir=out,
        per_device_train_batch_size=args.batch_size,
        max_steps=args.steps,
        use_cpu=not args.gpu,
        ddp_backend="nccl" if args.gpu else "gloo",
        bf16=args.gpu,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=workers,
        dataloader_persistent_workers=workers > 0,
        learning_rate=1e-3,
        seed=0,
    )
    busy = inject_ms(args) if args.inject == "slow_compute_rank" else 0.0
    trainer = SlowRankTrainer(
        model=model,
        args=targs,
        train_dataset=ds,
        data_collator=collator,
        callbacks=[Timing(StepLog(args.timing_dir))],
        busy_ms=busy,
        slow_rank=args.slow_rank,
    )
    trainer.train()


if __name__ == "__main__":
    main()
