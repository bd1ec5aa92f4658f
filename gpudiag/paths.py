"""Where the folders shipped with gpudiag are: the Streamlit dashboard and the sample runs.

In the repository they are top-level folders beside the package (dashboards/,
sample_runs/); a wheel or `pip install .` ships them inside it as gpudiag/dashboards and
gpudiag/sample_runs (pyproject.toml's package-dir). An editable install and a checkout
on PYTHONPATH both use the repository's folders.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def _shipped(name: str, marker: str) -> Path:
    """gpudiag/<name> when installed, else <checkout>/<name> (the first holding marker);
    the checkout's path when neither does, so error messages name where it should be."""
    package = Path(str(resources.files("gpudiag")))
    candidates = (package / name, package.parent / name)
    for folder in candidates:
        if (folder / marker).exists():
            return folder
    return candidates[1]


def dashboards_dir() -> Path:
    return _shipped("dashboards", "app.py")


def sample_runs_dir() -> Path:
    return _shipped("sample_runs", "README.md")
