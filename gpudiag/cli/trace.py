"""`gpudiag trace [options] script.py [args...]`: run a training script under capture.

This module parses and checks the options (everything after the script or module name
belongs to the script) and hands the launcher (gpudiag/capture/launcher.py) the parsed
arguments and the pre-run lint of the script (written to the run's lint.json while the job
starts), so capture never imports the linter. Exit codes: the job's own; 2 for bad usage.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpudiag.capture.launcher import TraceArgs

# torchrun options passed through: flag -> takes a value
TORCHRUN_OPTIONS: dict[str, bool] = {
    "--nproc-per-node": True,
    "--nnodes": True,
    "--node-rank": True,
    "--rdzv-endpoint": True,
    "--rdzv-backend": True,
    "--rdzv-id": True,
    "--rdzv-conf": True,
    "--master-addr": True,
    "--master-port": True,
    "--max-restarts": True,
    "--standalone": False,
}
GPUDIAG_OPTIONS: dict[str, bool] = {
    "--out": True,
    "--profile-steps": True,
    "--no-profile": False,
    "--sample-hz": True,
    "--hang-timeout": True,
    "--on-hang": True,
    "--no-lint": False,
    "--time-buckets": False,
    "-h": False,
    "--help": False,
}
# what a hang does to the job (gpudiag.capture.watchdog's docstring)
ON_HANG_CHOICES = ("auto", "end", "report")


class UsageError(Exception):
    pass


class ModuleMissing(UsageError):
    """``-m NAME`` where python would find no module: python's own words, exit code 1,
    and no run directory (was a traceback from the rank and a failed run)."""


class LauncherRefused(UsageError):
    """The target is a launcher (accelerate launch, torchrun): one line, no usage."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpudiag trace",
        usage="gpudiag trace [options] (script.py | -m module) [script args...]",
        description="Run a training script under capture; everything after the script or "
        "module name is passed to it.",
        allow_abbrev=False,
    )
    p.add_argument("--out", help="run directory (default ./gpudiag_runs/<script>-<time>)")
    p.add_argument(
        "--profile-steps",
        metavar="A-B",
        help="steps to profile (default 5-9, or the steps there are in a shorter run)",
    )
    p.add_argument("--no-profile", action="store_true", help="no torch.profiler trace")
    p.add_argument("--sample-hz", type=float, default=10.0, help="GPU/host sampling rate")
    p.add_argument(
        "--hang-timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="a hang: ranks wait in a collective (or the rendezvous) with no progress "
        "this long while no rank works; its stacks and report are written (0 disables)",
    )
    p.add_argument(
        "--on-hang",
        choices=ON_HANG_CHOICES,
        default="auto",
        help="auto (default): end the job on a hang only when every rank of the job is on "
        "this host and waits in a collective or is gone, not all in the same one; a rank "
        "idle outside a collective "
        "may wait on purpose, so the job goes on (torch's own timeout ends a real hang). "
        "end: end it on any hang. report: never end it",
    )
    p.add_argument("--no-lint", action="store_true", help="do not lint the script")
    p.add_argument(
        "--time-buckets",
        action="store_true",
        help="gloo: time every DDP bucket all-reduce with a Python comm hook "
        "(completion times for the whole run; costs ~0.5 ms per step)",
    )
    torchrun = p.add_argument_group("passed to torch.distributed.run")
    torchrun.add_argument("--nproc-per-node")
    torchrun.add_argument("--nnodes")
    torchrun.add_argument("--node-rank", type=int)
    torchrun.add_argument("--rdzv-endpoint")
    torchrun.add_argument("--rdzv-backend")
    torchrun.add_argument("--rdzv-id")
    torchrun.add_argument(
        "--rdzv-conf",
        metavar="K=V,...",
        help="e.g. timeout=60 (static) or join_timeout=60 (c10d): how long a node waits "
        "for the others",
    )
    torchrun.add_argument("--master-addr")
    torchrun.add_argument("--master-port")
    torchrun.add_argument("--max-restarts")
    torchrun.add_argument("--standalone", action="store_true")
    return p


def _normalise(token: str) -> str:
    """--nproc_per_node and --nproc-per-node are the same option (as in torchrun)."""
    if token.startswith("--"):
        name, eq, value = token.partition("=")
        return name.replace("_", "-") + eq + value
    return token


def split_argv(argv: list[str]) -> tuple[list[str], dict[str, str], list[str]]:
    """(gpudiag options, target, script args): options end at the script or -m module."""
    known = {**GPUDIAG_OPTIONS, **TORCHRUN_OPTIONS}
    options: list[str] = []
    i = 0
    while i < len(argv):
        token = _normalise(argv[i])
        if token == "-m":
            if i + 1 >= len(argv):
                raise UsageError("-m needs a module name")
            return options, {"module": argv[i + 1]}, argv[i + 2 :]
        if token == "--":
            i += 1
            break
        if not token.startswith("-") or token == "-":
            break
        name = token.split("=", 1)[0]
        if name not in known:
            raise UsageError(f"unknown option {argv[i]!r} (script options go after the script)")
        options.append(token)
        if known[name] and "=" not in token:
            if i + 1 >= len(argv):
                raise UsageError(f"{name} needs a value")
            options.append(argv[i + 1])
            i += 1
        i += 1
    if i >= len(argv):
        raise UsageError("no script given")
    return options, {"script": argv[i]}, argv[i + 1 :]


# --sample-hz bounds: below, a sample every 100 s says nothing; above, the sampler
# thread would take a core of the machine it measures.
MIN_SAMPLE_HZ = 0.01
MAX_SAMPLE_HZ = 1000.0
# --nproc-per-node words torchrun understands besides a count
NPROC_WORDS = ("auto", "cpu", "gpu", "xpu")


def _positive_int(text: str, name: str, minimum: int = 1, maximum: int | None = None) -> int:
    try:
        value = int(text, 10)
    except (TypeError, ValueError):
        value = None
    if value is None or value < minimum or (maximum is not None and value > maximum):
        upper = f" and <= {maximum}" if maximum is not None else ""
        raise UsageError(f"{name} {text!r}: expected an integer >= {minimum}{upper}")
    return value


def check_options(ns: argparse.Namespace) -> None:
    """Refuse values torchrun or the sampler would fail on later (or loop on), with one
    line naming the option, before anything starts."""
    if ns.profile_steps:
        from gpudiag.capture.profiling import parse_window

        try:
            parse_window(ns.profile_steps)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    if not (math.isfinite(ns.sample_hz) and MIN_SAMPLE_HZ <= ns.sample_hz <= MAX_SAMPLE_HZ):
        raise UsageError(
            f"--sample-hz {ns.sample_hz:g}: expected a number from {MIN_SAMPLE_HZ:g} "
            f"to {MAX_SAMPLE_HZ:g}"
        )
    if not (math.isfinite(ns.hang_timeout) and ns.hang_timeout >= 0):
        raise UsageError(f"--hang-timeout {ns.hang_timeout:g}: expected seconds >= 0 (0 disables)")
    if ns.nproc_per_node is not None and ns.nproc_per_node not in NPROC_WORDS:
        try:
            _positive_int(ns.nproc_per_node, "--nproc-per-node")
        except UsageError:
            raise UsageError(
                f"--nproc-per-node {ns.nproc_per_node!r}: expected a count >= 1 or one of "
                + ", ".join(NPROC_WORDS)
            ) from None
    if ns.nnodes is not None:
        parts = ns.nnodes.split(":")
        if len(parts) > 2:
            raise UsageError(f"--nnodes {ns.nnodes!r}: expected N or MIN:MAX")
        low, high = (_positive_int(p, "--nnodes") for p in (parts[0], parts[-1]))
        if low > high:
            raise UsageError(f"--nnodes {ns.nnodes!r}: MIN is larger than MAX")
    if ns.node_rank is not None and ns.node_rank < 0:
        raise UsageError(f"--node-rank {ns.node_rank}: expected an integer >= 0")
    if ns.max_restarts is not None:
        _positive_int(ns.max_restarts, "--max-restarts", minimum=0)
    if ns.master_port is not None:
        _positive_int(ns.master_port, "--master-port", minimum=1, maximum=65535)
    for name in ("out", "rdzv_endpoint", "rdzv_backend", "rdzv_id", "rdzv_conf", "master_addr"):
        value = getattr(ns, name)
        if value is not None and not value.strip():
            raise UsageError(f"--{name.replace('_', '-')}: empty value")


# Launchers that start the training script in processes of their own, through
# torch.distributed.run: gpudiag would trace the launcher, not the ranks. Refused at start
# with the command that traces the script itself (its ranks then get torchrun's
# environment, which Accelerator and Lightning read). Module -> its name for the message.
LAUNCHER_MODULES: dict[str, str] = {
    "accelerate.commands.launch": "accelerate launch",
    "accelerate.commands.accelerate_cli": "accelerate",
    "torch.distributed.run": "torchrun",
    "torch.distributed.launch": "torch.distributed.launch",
}
LAUNCHER_SCRIPTS: dict[str, str] = {"accelerate": "accelerate", "torchrun": "torchrun"}
# a console script's stub: `from accelerate.commands.accelerate_cli import main`
_STUB_IMPORT = "from {module} import main"


def refused_launcher(target: dict[str, str]) -> str | None:
    """The name of the launcher ``target`` is (``-m accelerate.commands.launch``, the
    ``accelerate`` or ``torchrun`` command, ...), or None for a training script."""
    module = target.get("module")
    if module is not None:
        return LAUNCHER_MODULES.get(module)
    path = Path(target["script"])
    if path.suffix == ".py":
        return None
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096).decode("utf-8", "replace")
    except OSError:
        head = ""
    for mod, name in LAUNCHER_MODULES.items():
        if _STUB_IMPORT.format(module=mod) in head:
            return name
    # a shell shim (pyenv, conda wrappers) named like the command
    if head.startswith("#!") and "python" not in head.splitlines()[0]:
        return LAUNCHER_SCRIPTS.get(path.name)
    return None


def _launcher_refusal(name: str) -> str:
    if name.startswith("accelerate"):
        return (
            "accelerate launch starts the training script in processes of its own, which "
            "gpudiag does not follow; trace the script itself, as torchrun would start it: "
            "gpudiag trace --nproc-per-node N script.py [args] (Accelerator reads torchrun's "
            "environment)"
        )
    return (
        f"{name} starts the training script in processes of its own, which gpudiag does "
        "not follow; gpudiag trace takes torchrun's options itself: gpudiag trace "
        "--nproc-per-node N script.py [args]"
    )


def parse(argv: list[str]) -> TraceArgs:
    from gpudiag.capture.launcher import TraceArgs

    options_argv, target, script_args = split_argv(argv)
    ns = _parser().parse_args(options_argv)
    check_options(ns)
    if "script" in target:
        _check_script(Path(target["script"]))
    launcher = refused_launcher(target)
    if launcher is not None:
        raise LauncherRefused(_launcher_refusal(launcher))
    if "module" in target:
        _check_module(target["module"])
    torchrun_argv = []
    for name, takes_value in TORCHRUN_OPTIONS.items():
        value = getattr(ns, name[2:].replace("-", "_"))
        if takes_value and value is not None:
            torchrun_argv += [name, str(value)]
        elif not takes_value and value:
            torchrun_argv.append(name)
    return TraceArgs(ns, target, script_args, torchrun_argv)


def _check_script(path: Path) -> None:
    """What python runs as a script: a file (a .py, a zip application) or a directory
    with a ``__main__.py`` (``python pkgdir``)."""
    if path.is_dir() and not (path / "__main__.py").is_file():
        raise UsageError(f"{path}: a directory without __main__.py; python cannot run it")
    if not path.is_file() and not path.is_dir():
        raise UsageError(f"{path}: no such script")


def _check_module(name: str) -> None:
    """The top-level package of ``-m NAME`` exists where python -m looks (the working
    folder first, then sys.path). Only the top level: finding a submodule would import
    its package here, in the launcher."""
    top = name.split(".")[0]
    if not top or top in sys.builtin_module_names:
        return
    if importlib.machinery.FrozenImporter.find_spec(top) is not None:
        return
    if importlib.machinery.PathFinder.find_spec(top, [os.getcwd(), *sys.path[1:]]) is not None:
        return
    if not _found_by_meta_path(top):
        raise ModuleMissing(f"No module named {name}")


def _found_by_meta_path(top: str) -> bool:
    return _meta_path_spec(top) is not None


def _meta_path_spec(top: str) -> importlib.machinery.ModuleSpec | None:
    """The spec of a top-level package no folder on sys.path holds but an import hook
    finds: an editable install (``pip install -e .``: setuptools' finder maps the name to
    the checkout), a custom loader. Finding a top-level name imports nothing."""
    for finder in sys.meta_path:
        if finder is importlib.machinery.PathFinder:
            continue
        find_spec = getattr(finder, "find_spec", None)
        if find_spec is None:
            continue
        try:
            spec = find_spec(top, None)
        except Exception:  # a broken third-party hook: python -m would say so itself
            continue
        if spec is not None:
            return spec
    return None


def _hooked_module_file(parts: list[str]) -> Path | None:
    """The file of module ``parts`` under a top-level package an import hook found."""
    spec = _meta_path_spec(parts[0])
    if spec is None:
        return None
    if len(parts) == 1 and not spec.submodule_search_locations:
        return Path(spec.origin) if spec.origin and Path(spec.origin).is_file() else None
    for location in spec.submodule_search_locations or []:
        base = Path(location).joinpath(*parts[1:])
        candidates = (
            [base / "__main__.py"]
            if len(parts) == 1
            else [base.with_suffix(".py"), base / "__main__.py"]
        )
        for candidate in candidates:
            if candidate.is_file():
                return candidate
    return None


def lint_target(target: dict[str, str]) -> Path | None:
    """The file `gpudiag trace` runs: the script (a directory's ``__main__.py``), or the
    module's file on sys.path."""
    if "script" in target:
        path = Path(target["script"])
        return path / "__main__.py" if path.is_dir() else path
    parts = target["module"].split(".")
    for base in [Path.cwd(), *map(Path, sys.path[1:])]:
        for candidate in (
            base.joinpath(*parts).with_suffix(".py"),
            base.joinpath(*parts, "__main__.py"),
        ):
            if candidate.is_file():
                return candidate
    return _hooked_module_file(parts)


def lint_into_run(run_dir: Path, target: dict[str, str]) -> str | None:
    """Lint the traced script into <run_dir>/lint.json; a one-line reason when skipped."""
    from gpudiag import rundir
    from gpudiag.lint import lint_paths

    path = lint_target(target)
    if path is None:
        return None
    try:
        rundir.write_json_atomic(run_dir / rundir.LINT, lint_paths([path]).to_json())
    except Exception as exc:  # noqa: BLE001 - the job runs whatever the linter does
        return f"lint skipped ({type(exc).__name__}: {exc})"
    return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["-h"], ["--help"]) or not argv:
        _parser().print_help()
        return 0 if argv else 2
    try:
        args = parse(argv)
    except UsageError as exc:
        print(f"gpudiag: trace: {exc}", file=sys.stderr)
        if isinstance(exc, ModuleMissing):
            return 1  # as python -m
        if not isinstance(exc, LauncherRefused):
            print(_parser().format_usage().rstrip(), file=sys.stderr)
        return 2
    from gpudiag.capture import launcher

    return launcher.run(args, argv, pre_run=lint_into_run)
