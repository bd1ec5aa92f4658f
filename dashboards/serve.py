"""Streamlit for the gpudiag dashboard, with every run analysed in the background from
the moment the server starts, so the first page view finds its analysis (and the heavy
imports) already done. `gpudiag dashboard` starts it; its arguments are `streamlit`'s
own (`run dashboards/app.py --server.port P ... -- RUN ...`)."""

from __future__ import annotations

import logging
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _roots(argv: list[str]) -> list[Path]:
    from dashboards import runs

    if "--" in argv:
        given = [Path(a) for a in argv[argv.index("--") + 1 :] if a and not a.startswith("-")]
        if given:
            return given
    return list(runs.DEFAULT_ROOTS)


def _prewarm(roots: list[Path]) -> None:
    """Analyse every run once through the app's own cache; failures are the app's to show."""
    # the cache is used outside a script run here: that is expected, not worth a warning
    logging.getLogger("streamlit.runtime.scriptrunner_utils.script_run_context").setLevel(
        logging.ERROR
    )
    logging.getLogger("streamlit.runtime.caching.cache_data_api").setLevel(logging.ERROR)
    from dashboards import cache, runs, views  # noqa: F401 - views: plotly and figures too

    for ref in runs.discover_runs(roots):
        try:
            cache.result_of(ref)
        except Exception:  # noqa: BLE001 - the app reports it when the run is opened
            continue


def main() -> int:
    argv = sys.argv[1:]
    threading.Thread(
        target=_prewarm, args=(_roots(argv),), name="gpudiag-prewarm", daemon=True
    ).start()
    from streamlit.web import cli

    sys.argv = ["streamlit", *argv]
    return cli.main()


if __name__ == "__main__":
    sys.exit(main())
