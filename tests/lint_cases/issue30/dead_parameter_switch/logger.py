"""A logger in the style of phasic-policy-gradient's: timing scopes that can synchronise."""

import contextlib
import time

import torch as th

_timings = {}


def _sync_cuda():
    th.cuda.synchronize()


@contextlib.contextmanager
def profile_kv(scopename, sync_cuda=False):
    if sync_cuda:  # opt-in per call: no call below passes it
        _sync_cuda()
    start = time.time()
    try:
        yield
    finally:
        if sync_cuda:
            _sync_cuda()
        _timings[scopename] = _timings.get(scopename, 0.0) + time.time() - start


def logkv_mean(key, value, *, to_host=False):
    if to_host:  # the train loop below asks for it: live
        value = value.item()  # expect: GD301
    _timings[key] = value


def record_grad_norm(model, *, check=False):
    norm = th.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    if check:  # off by default, and every call leaves it off
        assert th.isfinite(norm)
    return norm
