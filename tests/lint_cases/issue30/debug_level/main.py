# CenterNet's layout (thirteenth judge): the options module is found only through a
# sys.path entry, so no import links it to the trainers.
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "lib"))

from opts import parse  # noqa: E402
from trains.det import DetTrainer  # noqa: E402


def main():
    opt = parse()
    trainer = DetTrainer(opt)
    for epoch in range(opt.epochs):
        trainer.run_epoch(epoch)


if __name__ == "__main__":
    main()
