"""A one-process loop over a torch.compile'd module (backend "eager": no C compiler
needed), a gpudiag.region around every step. ``--own-hook`` registers a global module
forward hook of the script's own, about which torch.compile rightly warns."""

import argparse

import torch
import torch.nn as nn

import gpudiag

ap = argparse.ArgumentParser()
ap.add_argument("--own-hook", action="store_true")
args = ap.parse_args()
if args.own_hook:
    torch.nn.modules.module.register_module_forward_hook(lambda module, inputs, output: None)
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
compiled = torch.compile(model, backend="eager")
for _ in range(15):
    with gpudiag.region("step"):
        opt.zero_grad()
        compiled(torch.randn(32, 64)).sum().backward()
        opt.step()
print("DONE_OK")
