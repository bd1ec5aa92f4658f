# CodeBERT / SpanBERT (judge 19, F2): evaluation loaders over a TensorDataset of token ids
# stall no training step: no GD204; the training loader over the same kind of data keeps it.
# Since judge 20 (D1) no evaluation-only loader gets GD204, over a project dataset either.
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset, SequentialSampler, TensorDataset


class Images(Dataset):
    def __len__(self):
        return 100

    def __getitem__(self, i):
        return torch.randn(3, 32, 32), i % 10


def evaluate(model, eval_dataloader):
    model.eval()
    with torch.no_grad():
        for (ids,) in eval_dataloader:
            model(ids.cuda().float())


def main():
    model = nn.Linear(16, 1).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ids = torch.randint(0, 1000, (512, 16), dtype=torch.long)
    train_data = TensorDataset(ids)
    train_dataloader = DataLoader(train_data, batch_size=8, shuffle=True)  # expect: GD204
    eval_data = TensorDataset(ids[:64])
    eval_sampler = SequentialSampler(eval_data)
    eval_dataloader = DataLoader(eval_data, sampler=eval_sampler, batch_size=8)
    test_dataloader = DataLoader(TensorDataset(ids[64:128]), batch_size=8)
    val_loader = DataLoader(Images(), batch_size=8, num_workers=4)
    for (x,) in train_dataloader:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x.cuda().float()).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    evaluate(model, eval_dataloader)
    evaluate(model, test_dataloader)
    evaluate(model, val_loader)


if __name__ == "__main__":
    main()
