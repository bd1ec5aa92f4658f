# ssd.pytorch (judge 19, M1): a CUDA fp32 default tensor type puts new tensors on the GPU,
# it decides no precision: the fp32 loop without autocast is still GD601.
import torch
import torch.nn as nn

torch.set_default_tensor_type("torch.cuda.FloatTensor")


def train():
    net = nn.Conv2d(3, 8, 3).cuda()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for _ in range(100):
        x = torch.randn(8, 3, 32, 32).cuda()
        loss = net(x).mean()
        opt.zero_grad()
        loss.backward()  # expect: GD601
        opt.step()


if __name__ == "__main__":
    train()
