# hubert's train.py (thirteenth judge): `--mask` chooses the training objective; both
# branches log every step. Not an opt-in sync.
import argparse

import torch  # noqa: F401 (the file is torch code, as the real one)

parser = argparse.ArgumentParser()
parser.add_argument("--mask", action="store_true", help="whether to use input masking.")


def train(args, model, loader, optimizer):
    for x in loader:
        logits = model(x.cuda())
        if args.mask:
            loss = logits[:, :4].mean()
        else:
            loss = logits.mean()
        optimizer.zero_grad()
        loss.backward()  # expect: GD601
        optimizer.step()
        if args.mask:
            print(loss.item())  # expect: GD301
        else:
            print(loss.item())  # expect: GD301
