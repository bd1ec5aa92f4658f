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
