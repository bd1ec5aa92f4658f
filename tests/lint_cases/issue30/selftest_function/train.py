import optim_utils
import torch

model = torch.nn.Linear(10, 2).cuda()
opt = optim_utils.MyAdam(model.parameters())
loader = torch.utils.data.DataLoader(
    torch.load("d.pt"), batch_size=8, num_workers=4, pin_memory=True
)
for x, y in loader:
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(x.cuda(non_blocking=True))
        loss = torch.nn.functional.cross_entropy(out, y.cuda(non_blocking=True))
    loss.backward()
    opt.step()
    opt.zero_grad()
