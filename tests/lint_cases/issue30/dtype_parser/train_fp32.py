"""phasic-policy-gradient style: a generic dtype parser and a float16 branch no call takes;
the job trains in fp32."""

import torch as th
from torch import nn


def parse_dtype(x):
    if isinstance(x, th.dtype):
        return x
    elif isinstance(x, str):
        if x == "float32" or x == "float":
            return th.float32
        elif x == "float64" or x == "double":
            return th.float64
        elif x == "float16" or x == "half":
            return th.float16
        elif x == "uint8":
            return th.uint8
        else:
            raise ValueError(f"cannot parse {x} as a dtype")
    raise TypeError(x)


def NormedLinear(*args, scale=1.0, dtype=th.float32, **kwargs):
    dtype = parse_dtype(dtype)
    if dtype == th.float32:
        out = nn.Linear(*args, **kwargs)
    elif dtype == th.float16:
        raise NotImplementedError("half-precision linear layers are not supported")
    else:
        raise ValueError(dtype)
    out.weight.data *= scale / out.weight.norm(dim=1, p=2, keepdim=True)
    out.bias.data *= 0
    return out


def learn(venv, n_iter):
    policy = NormedLinear(64, 8, dtype=parse_dtype("float32")).cuda()
    opt = th.optim.Adam(policy.parameters(), lr=5e-4)
    for _ in range(n_iter):
        obs = venv.rollout().cuda()
        loss = policy(obs).logsumexp(-1).mean()
        opt.zero_grad()
        loss.backward()  # expect: GD601
        opt.step()
