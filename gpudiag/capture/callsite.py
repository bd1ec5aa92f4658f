"""Where in the user's code a collective was issued (runs inside the training process)."""

from __future__ import annotations

import os
import sys
from types import FrameType

_LIB_MARKERS = (
    f"{os.sep}torch{os.sep}",
    f"{os.sep}gpudiag{os.sep}capture{os.sep}",
    "<frozen ",
    "runpy.py",
    f"{os.sep}contextlib.py",
    f"{os.sep}functools.py",
)


def is_library_file(filename: str) -> bool:
    return any(marker in filename for marker in _LIB_MARKERS)


def user_callsite() -> str | None:
    """``file:line in func`` of the first frame outside torch and gpudiag."""
    frame: FrameType | None
    try:
        frame = sys._getframe(2)
    except ValueError:  # called near the bottom of a thread's stack
        return None
    while frame is not None:
        filename = frame.f_code.co_filename
        if not is_library_file(filename):
            return f"{filename}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back
    return None
