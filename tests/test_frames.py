"""Which stack frames are the user's (gpudiag/frames.py): decided by where torch, gpudiag,
the standard library and installed packages really are, never by a folder's name. A
user's script in a folder named ``gpudiag`` or ``torch`` (the folder `git clone` gives
this repository) keeps its frames; real stacks through torch and gpudiag code give the
script's line."""

from __future__ import annotations

import faulthandler
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from types import ModuleType

import pytest
import torch
import torch.distributed.distributed_c10d as c10d

import gpudiag
import gpudiag.capture.worker
import gpudiag.reference.train
from gpudiag import frames, rundir
from gpudiag.analysis import analyze, mismatch
from gpudiag.analysis.findings import user_frame
from gpudiag.capture import threads
from gpudiag.capture.watchdog import distributed_call, in_torch_distributed, top_user_frame

sys.path.insert(0, str(Path(__file__).parent / "scripts"))
import coll_launch  # noqa: E402

# A user's script, written into folders named like the libraries. Each marked line is
# the one the frame filter must find.
SCRIPT = '''\
import threading
import time
import traceback

import torch
from gpudiag.capture import threads
from gpudiag.capture.callsite import user_callsite


def callsite():
    return torch.no_grad()(lambda: user_callsite())()  # CALLSITE


def failing():
    try:
        torch.nn.Linear(2, 2)(torch.ones(3))  # RAISE
    except RuntimeError:
        return traceback.format_exc()


def sleeper(started, release):
    started.set()
    torch.no_grad()(release.wait)(30)  # SLEEP


def start_sleeper():
    """A thread started by gpudiag's threads.start, waiting inside torch code."""
    started, release = threading.Event(), threading.Event()
    thread = threads.start(sleeper, "sleeper", (started, release))
    started.wait()
    return thread, release
'''


def _line(path: Path, marker: str) -> int:
    return next(i for i, t in enumerate(path.read_text().splitlines(), 1) if f"# {marker}" in t)


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"user_{abs(hash(path))}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(params=["gpudiag", "torch", "venv/lib", "plain"])
def script(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """The user's script in <tmp>/gpudiag/, <tmp>/torch/, a venv folder, or a plain one."""
    path = tmp_path / request.param / "train.py"
    path.parent.mkdir(parents=True)
    path.write_text(SCRIPT)
    return path


# --------------------------------------------------------------------------- paths


def test_library_files_are_the_installed_packages() -> None:
    import pytest as installed_package  # from site-packages, like any dependency

    for module in (torch, c10d, gpudiag, gpudiag.capture.worker, frames, threading, faulthandler):
        if getattr(module, "__file__", None):
            assert frames.is_library_file(module.__file__), module
    assert frames.is_library_file(installed_package.__file__)
    for pseudo in ("<frozen runpy>", "<frozen importlib._bootstrap>", "<string>"):
        assert frames.is_library_file(pseudo)
    assert frames.package_module(c10d.__file__) == "torch.distributed.distributed_c10d"
    assert frames.package_module(gpudiag.capture.worker.__file__) == "gpudiag.capture.worker"
    assert frames.in_module(c10d.__file__, "torch.distributed")
    assert not frames.in_module(torch.__file__, "torch.distributed")
    # the reference trainers are the training script when one runs them
    assert frames.is_user_file(gpudiag.reference.train.__file__)
    # the test's own file sits in the checkout, beside the package: the user's
    assert frames.is_user_file(__file__)


def test_the_package_folders_are_where_python_imports_them_from() -> None:
    dirs = frames.package_dirs()
    assert dirs["torch"] == os.path.realpath(Path(torch.__file__).parent)
    assert dirs["gpudiag"] == os.path.realpath(Path(gpudiag.__file__).parent)
    roots = frames.library_dirs()
    assert all(r.endswith(os.sep) for r in roots)
    assert os.path.join(dirs["gpudiag"], "") in roots


@pytest.mark.parametrize("folder", ["gpudiag", "torch", "torch/distributed", "gpudiag/capture"])
def test_a_users_file_in_a_folder_named_like_a_library_is_the_users(
    tmp_path: Path, folder: str
) -> None:
    path = tmp_path / folder / "train.py"
    path.parent.mkdir(parents=True)
    path.write_text("print('hi')\n")
    assert frames.is_user_file(str(path))
    assert frames.package_module(str(path)) is None
    assert not frames.in_module(str(path), "torch.distributed")


def test_a_users_script_inside_a_virtual_environment_folder_is_the_users(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    script = venv / "train.py"
    installed = venv / "lib" / "python3.11" / "site-packages" / "pkg" / "mod.py"
    for path in (script, installed):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n")
    assert frames.is_user_file(str(script))
    assert frames.is_library_file(str(installed))  # another environment's packages


def test_symbolic_links_are_resolved(tmp_path: Path) -> None:
    """A link to torch's folder is torch; a link named torch to a user's folder is not."""
    torch_dir = Path(torch.__file__).parent
    (tmp_path / "elsewhere").symlink_to(torch_dir, target_is_directory=True)
    linked = tmp_path / "elsewhere" / "distributed" / "distributed_c10d.py"
    assert frames.is_library_file(str(linked))
    assert frames.in_module(str(linked), "torch.distributed")
    user = tmp_path / "project"
    user.mkdir()
    (user / "distributed_c10d.py").write_text("\n")
    (tmp_path / "torch").symlink_to(user, target_is_directory=True)
    assert frames.is_user_file(str(tmp_path / "torch" / "distributed_c10d.py"))


def test_paths_from_another_machine() -> None:
    """Stacks recorded elsewhere and analysed here: files that do not exist here are the
    installed packages' when they lie in site-packages or an interpreter's library, or
    when their path below a torch/gpudiag folder names a file of that package."""
    assert frames.is_library_file("/opt/conda/lib/python3.10/site-packages/foo/bar.py")
    assert frames.is_library_file("/usr/lib/python3.10/threading.py")
    assert frames.is_library_file("/usr/lib/python3/dist-packages/foo.py")
    remote = "/nonexistent/src/pytorch/torch/distributed/distributed_c10d.py"
    assert frames.package_module(remote) == "torch.distributed.distributed_c10d"
    remote = "/nonexistent/home/u/gpudiag/gpudiag/capture/worker.py"
    assert frames.package_module(remote) == "gpudiag.capture.worker"
    for user in ("/nonexistent/x/gpudiag/train.py", "/nonexistent/x/torch/train.py"):
        assert frames.is_user_file(user)


# --------------------------------------------------------------------------- real stacks


def test_collective_callsite_through_torch_is_the_scripts_line(script: Path) -> None:
    site = _load(script).callsite()
    assert site == f"{script}:{_line(script, 'CALLSITE')} in callsite"


def test_traceback_through_torch_gives_the_scripts_line(script: Path) -> None:
    text = _load(script).failing()
    assert "torch" in text and "linear.py" in text  # raised inside torch's own code
    assert user_frame(text) == f"{script}:{_line(script, 'RAISE')}"


def test_dumped_stack_through_gpudiag_and_torch_gives_the_scripts_line(
    script: Path, tmp_path: Path
) -> None:
    thread, release = _load(script).start_sleeper()
    try:
        dump = tmp_path / "stacks.txt"
        with dump.open("w") as fh:
            faulthandler.dump_traceback(fh, all_threads=True)
    finally:
        release.set()
        thread.join()
    text = dump.read_text()
    block = next(b for b in re.split(r"\n\s*\n", text) if f"0x{thread.ident:016x}" in b)
    files = re.findall(r'File "([^"]+)"', block)
    # innermost threading's Event.wait and torch's decorator, then the script, then
    # gpudiag's thread starter and threading's bootstrap
    at = files.index(str(script))
    assert [frames.package_module(f) or "" for f in files[:at]][-1].startswith("torch.")
    assert all(frames.is_library_file(f) for f in files[:at])
    assert threads.__file__ in files[at + 1 :]
    line = _line(script, "SLEEP")
    assert top_user_frame(block) == f"{script}:{line} in sleeper"
    assert not in_torch_distributed(block) and distributed_call(block) is None


def test_abort_stack_in_torch_distributed_names_the_op_and_the_scripts_line(
    script: Path,
) -> None:
    """mismatch's reading of a rank's abort: the torch.distributed function, then the
    first user frame, with the script in a folder named like a library."""
    stack = (
        "Fatal Python error: Aborted\n\n"
        "Thread 0x0000000000000001 (most recent call first):\n"
        f'  File "{c10d.__file__}", line 10 in all_reduce\n'
        f'  File "{Path(torch.__file__).parent / "distributed" / "c10d_logger.py"}", '
        "line 5 in wrapper\n"
        f'  File "{script}", line 3 in train\n'
        f'  File "{gpudiag.capture.worker.__file__}", line 1 in run\n'
    )

    class Run:
        stacks = {0: stack}

    call = mismatch._aborted_call(Run(), 0)
    assert call is not None
    assert call.op == "all_reduce"
    assert call.callsite == f"{script}:3 in train"


def test_is_cheap_on_the_collective_hot_path() -> None:
    """user_callsite runs on every collective: a file's verdict is cached."""
    path = c10d.__file__
    frames.is_library_file(path)
    info = frames._classify.cache_info()
    for _ in range(100):
        frames.is_library_file(path)
    assert frames._classify.cache_info().hits >= info.hits + 100


# --------------------------------------------------------------------------- a traced job


@pytest.mark.slow
def test_traced_job_in_a_folder_named_gpudiag_keeps_its_line(tmp_path: Path) -> None:
    """tests/test_reliability_gloo.py's rendezvous hang, its script in <tmp>/gpudiag/ (the
    folder `git clone` gives): the hang report and the finding name the script's line."""
    script = tmp_path / "gpudiag" / "rel_job.py"
    script.parent.mkdir()
    shutil.copy(Path(__file__).parent / "scripts" / "rel_job.py", script)
    out = tmp_path / "run"
    cmd = [
        sys.executable, "-m", "gpudiag", "trace", "--out", str(out), "--no-profile",
        "--no-lint", "--hang-timeout", "3", "--on-hang", "end", "--nproc-per-node", "2",
        "--master-port", str(coll_launch.free_port()), str(script), "rendezvous",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    report = json.loads((out / rundir.HANG_REPORT).read_text())
    line = next(
        i
        for i, t in enumerate(script.read_text().splitlines(), 1)
        if "never joins the rendezvous" in t
    )
    assert report["ranks"]["1"]["top_frame"].startswith(f"{script}:{line} "), proc.stderr
    finding = analyze(out).findings[0]
    assert finding.kind == "hang" and finding.ranks == [1]
    assert finding.location is not None and finding.location.startswith(f"{script}:{line}")
