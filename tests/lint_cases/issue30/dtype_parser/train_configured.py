"""The same parser, but the job's dtype comes from the command line: it may be bf16."""

import argparse

import torch as th


def parse_dtype(x):
    if x == "float32":
        return th.float32
    elif x == "bfloat16":
        return th.bfloat16
    raise ValueError(x)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    model = th.nn.Linear(64, 8).cuda().to(parse_dtype(args.dtype))
    opt = th.optim.Adam(model.parameters(), lr=5e-4)
    for _ in range(1000):
        x = th.randn(32, 64, device="cuda", dtype=parse_dtype(args.dtype))
        loss = model(x).logsumexp(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
