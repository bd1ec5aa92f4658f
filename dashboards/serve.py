"""Streamlit for the gpudiag dashboard, with the runs analysed in the background: the
first run (the one the app opens) from the moment the server starts, so the first page
view finds its analysis and the heavy imports done; the others once the server is quiet.
`gpudiag dashboard` starts it; its arguments are `streamlit`'s own
(`run dashboards/app.py --server.port P ... -- RUN ...`)."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

# Run by path (`gpudiag dashboard`). Installed, this is gpudiag/dashboards/serve.py; in a
# source checkout dashboards/ sits beside gpudiag/ and is imported as `dashboards`.
_INSTALLED = (Path(__file__).resolve().parents[1] / "__init__.py").is_file()
if not _INSTALLED:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

QUIET_S = 3.0
UNATTENDED_S = 20.0
_STARTED = time.monotonic()


def _modules() -> tuple[Any, Any]:
    """The dashboard's cache and runs modules (views too: plotly and figures load here)."""
    if _INSTALLED:
        from gpudiag.dashboards import (  # type: ignore[import-not-found,no-redef,unused-ignore]
            cache,
            runs,
            views,
        )
    else:
        from dashboards import cache, runs, views  # noqa: F401
    return cache, runs


def _roots(argv: list[str]) -> list[Path]:
    if _INSTALLED:
        from gpudiag.dashboards import runs  # type: ignore[import-not-found,no-redef,unused-ignore]
    else:
        from dashboards import runs

    if "--" in argv:
        given = [Path(a) for a in argv[argv.index("--") + 1 :] if a and not a.startswith("-")]
        if given:
            return given
    return list(runs.DEFAULT_ROOTS)


def _prewarm(roots: list[Path]) -> None:
    """Analyse every run once through the app's own cache (a plain module cache, which
    needs no script run context); failures are the app's to show."""
    cache, runs = _modules()

    refs = runs.discover_runs(roots)
    for i, ref in enumerate(refs):
        if i:  # the first run is the one the app opens; the others wait for a quiet server
            _wait_until_quiet(cache.activity)
        if runs.is_live(ref):  # still being written: shown live, analysed when it ends
            continue
        try:
            cache.result_of(ref)
        except Exception:  # noqa: BLE001 - the app reports it when the run is opened
            continue


def _wait_until_quiet(activity: Any) -> None:
    """Until no script has run for QUIET_S (the browser has drawn its page meanwhile), or,
    when no browser came, until UNATTENDED_S after start: analysing the other runs while a
    browser loads its first page slows that page by the analyses' CPU and GIL time."""
    while activity.quiet_for() < QUIET_S:
        if not activity.ever_ran() and time.monotonic() - _STARTED > UNATTENDED_S:
            return
        time.sleep(0.25)


def main() -> int:
    argv = sys.argv[1:]
    # Streamlit (with plotly and pandas) is imported here, before the prewarm thread
    # imports the analysis: plotly looks pandas up in sys.modules, and a pandas still
    # being imported by the other thread is a half-initialised module there.
    from streamlit.web import cli

    threading.Thread(
        target=_prewarm, args=(_roots(argv),), name="gpudiag-prewarm", daemon=True
    ).start()

    sys.argv = ["streamlit", *argv]
    return cli.main()


if __name__ == "__main__":
    sys.exit(main())
