"""Where in the user's code a collective was issued (runs inside the training process)."""

from __future__ import annotations

import sys
from types import FrameType

from gpudiag import frames


def user_callsite() -> str | None:
    """``file:line in func`` of the first user frame of the caller's stack (outside torch,
    gpudiag, the standard library and installed packages: :mod:`gpudiag.frames`)."""
    frame: FrameType | None
    try:
        frame = sys._getframe(2)
    except ValueError:  # called near the bottom of a thread's stack
        return None
    try:
        while frame is not None:
            filename = frame.f_code.co_filename
            if frames.is_user_file(filename):
                return f"{frames.absolute(filename)}:{frame.f_lineno} in {frame.f_code.co_name}"
            frame = frame.f_back
    except Exception:  # never into the user's collective call
        return None
    return None


def library_callsite() -> str | None:
    """``file:line in func`` of the frame that called torch.distributed, when it is not
    the user's: a framework's own line (Lightning's per-step flag broadcast, an HF
    Trainer's gather), the first frame of the caller's stack outside torch and gpudiag.
    None when that frame is the user's (:func:`user_callsite` names it) or unknown."""
    frame: FrameType | None
    try:
        frame = sys._getframe(2)
    except ValueError:
        return None
    try:
        while frame is not None:
            filename = frame.f_code.co_filename
            if not (frames.in_module(filename, "torch") or frames.in_module(filename, "gpudiag")):
                if frames.is_user_file(filename):
                    return None
                return f"{frames.absolute(filename)}:{frame.f_lineno} in {frame.f_code.co_name}"
            frame = frame.f_back
    except Exception:  # never into the user's collective call
        return None
    return None
