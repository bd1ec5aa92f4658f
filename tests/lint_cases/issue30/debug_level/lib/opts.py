import argparse


def parse():
    parser = argparse.ArgumentParser()
    parser.add_argument("--debug", type=int, default=0, help="level of visualisation")
    parser.add_argument("--epochs", type=int, default=10)
    return parser.parse_args()
