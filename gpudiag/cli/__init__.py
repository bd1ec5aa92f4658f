"""`gpudiag` command line: dispatches to the sub-command's own module.

Each sub-command parses its own arguments, so `gpudiag trace` can pass everything after
the script name to the script untouched. Nothing heavy is imported here: `gpudiag
analyze` must start without importing torch.
"""

from __future__ import annotations

import importlib
import sys

# name -> (module, function, one-line help)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "trace": ("gpudiag.capture.launcher", "main", "run a training script under capture"),
    "analyze": ("gpudiag.analysis.cli", "analyze_main", "find bottlenecks in a run or traces"),
    "compare": ("gpudiag.analysis.cli", "compare_main", "two runs side by side"),
    "dashboard": ("gpudiag.dashboard_cli", "main", "open the Streamlit dashboard"),
    "lint": ("gpudiag.lint.cli", "main", "find DP/DDP anti-patterns in code"),
    "bench": ("gpudiag.reference.bench", "main", "single vs DP vs DDP comparison"),
}


def _usage() -> str:
    lines = ["usage: gpudiag <command> [options]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, _, help_) in COMMANDS.items()]
    lines += ["", "`gpudiag <command> --help` for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        from gpudiag import __version__

        print(f"gpudiag {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"gpudiag: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module, func, _ = COMMANDS[name]
    code = getattr(importlib.import_module(module), func)(rest)
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
