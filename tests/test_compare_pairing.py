"""Which runs the dashboard's Compare pairs by default (gpudiag.analysis.compare.comparable),
on copies of a shipped run whose manifests name the script and arguments differently
(issue 31 probe 31g): two runs of `train.py` with other arguments were paired without a
warning, and two trace sets that name no script (Megatron's and DLRM's 8-rank sets) were
paired as if one job."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gpudiag.analysis import analyze
from gpudiag.analysis.compare import comparable, shape_warnings

HEALTHY = Path(__file__).resolve().parents[1] / "sample_runs" / "ddp2_healthy"


def _copy(tmp_path: Path, name: str, **manifest: object) -> Path:
    run = tmp_path / name
    shutil.copytree(HEALTHY, run)
    path = run / "manifest.json"
    data = json.loads(path.read_text())
    data.update(manifest)
    path.write_text(json.dumps(data))
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("pairing")
    specs = {
        "a": {"script": "train.py", "argv": ["40", "25"]},
        "same": {"script": "train.py", "argv": ["40", "25"]},
        "other_args": {"script": "train.py", "argv": ["1700", "25"]},
        "no_script": {"script": None, "module": None, "argv": None},
        "no_script_2": {"script": None, "module": None, "argv": None},
    }
    return {name: analyze(_copy(root, name, **spec)) for name, spec in specs.items()}


def test_the_same_script_and_arguments_pair(runs: dict) -> None:
    assert runs["a"].run.script == ["train.py", "40", "25"]
    assert comparable(runs["a"], runs["same"])
    assert shape_warnings(runs["a"], runs["same"]) == []


def test_other_arguments_do_not_pair_and_are_warned_of(runs: dict) -> None:
    assert not comparable(runs["a"], runs["other_args"])
    (warning,) = shape_warnings(runs["a"], runs["other_args"])
    assert "'train.py 40 25'" in warning and "'train.py 1700 25'" in warning
    assert "`" not in warning  # shown literally in the dashboard: no Markdown marks


def test_runs_that_name_no_script_never_pair_by_default(runs: dict) -> None:
    assert runs["no_script"].run.script is None
    assert not comparable(runs["no_script"], runs["no_script_2"])
