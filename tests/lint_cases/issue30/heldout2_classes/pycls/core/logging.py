"""pycls: logging configured on the main process only, print suppressed on the others."""

import builtins
import logging

import pycls.core.distributed as dist


def _suppress_print():
    def ignore(*_objects, _sep=" ", _end="\n", _file=None, _flush=False):
        pass

    builtins.print = ignore


def setup_logging():
    if dist.is_main_proc():
        logging.basicConfig(level=logging.INFO)
    else:
        _suppress_print()


def get_logger(name):
    return logging.getLogger(name)
