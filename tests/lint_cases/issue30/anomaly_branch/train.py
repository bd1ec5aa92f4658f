# MOSS-RLHF (fifteenth judge): `.item()` in a branch taken only when the loss is NaN or
# inf runs on a bad step, not every step (was GD301); the test itself syncs every step.
import logging

import torch

model = torch.nn.Linear(8, 1).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = torch.utils.data.DataLoader(
    torch.load("data.pt"), batch_size=32, num_workers=4, pin_memory=True
)
for x, _y in loader:
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(x.cuda(non_blocking=True)).sum()
    loss.backward()
    if torch.isnan(loss) or torch.isinf(loss):  # expect: GD301
        logging.warning(f"strange loss {loss.item()}")
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    if torch.isfinite(norm):  # expect: GD301
        opt.step()
    else:
        logging.warning(f"skipped a step: grad norm {norm.item()}")
    # not an anomaly branch: the body runs whenever the loss is above 1, every step it may
    if loss > 1:  # expect: GD301
        print(loss.item())  # expect: GD301
    opt.zero_grad()
