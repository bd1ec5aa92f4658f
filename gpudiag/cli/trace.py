"""`gpudiag trace [options] script.py [args...]`: run a training script under capture.

The launcher (gpudiag/capture/launcher.py) parses the options and runs the job; this
command hands it the pre-run lint of the script (written to the run's lint.json while the
job starts), so capture never imports the linter itself.
"""

from __future__ import annotations

import sys
from pathlib import Path


def lint_target(target: dict[str, str]) -> Path | None:
    """The file `gpudiag trace` runs: the script, or the module's file on sys.path."""
    if "script" in target:
        return Path(target["script"])
    parts = target["module"].split(".")
    for base in [Path.cwd(), *map(Path, sys.path[1:])]:
        for candidate in (
            base.joinpath(*parts).with_suffix(".py"),
            base.joinpath(*parts, "__main__.py"),
        ):
            if candidate.is_file():
                return candidate
    return None


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
    from gpudiag.capture import launcher

    return launcher.main(list(sys.argv[1:] if argv is None else argv), pre_run=lint_into_run)
