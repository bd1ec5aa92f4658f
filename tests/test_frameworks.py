"""Issue 29: gpudiag's findings on real framework scripts (a small subset of
bench/frameworks_suite.py): healthy Lightning, healthy HF Trainer, and Lightning with one
rank doing 40 ms of extra compute per step, each recorded with `gpudiag trace` and scored
from `gpudiag analyze --json` against the issue's goals. Needs the `frameworks` extra
(pip install -e '.[frameworks]', after torch==2.13.0)."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


def _missing():
    for mod in ("lightning", "transformers", "accelerate"):
        try:
            importlib.import_module(mod)
        except Exception as e:  # ImportError, or a broken companion wheel (torchvision)
            return f"{mod} does not import ({type(e).__name__}: {e})"
    return None


def _suite():
    spec = importlib.util.spec_from_file_location(
        "frameworks_suite", ROOT / "bench" / "frameworks_suite.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    why = _missing()
    if why:
        pytest.skip(
            "the `frameworks` extra is not installed (pip install -e '.[frameworks]'): " + why
        )
    if shutil.which("gpudiag") is None:
        pytest.skip("the gpudiag command is not installed")
    suite = _suite()
    cases = ["lightning_ddp:none", "hf_trainer:none", "lightning_ddp:slow_compute_rank"]
    rows = suite.run_rep(
        cases, tmp_path_factory.mktemp("fw") / "rep1", hogs=0, timeout_s=600, rescore=False
    )
    return {r["case"]: r for r in rows}


def _explain(row):
    return f"{row['case']}: findings {row['findings']}; {row['why']}"


@pytest.mark.parametrize("case", ["lightning_ddp:none", "hf_trainer:none"])
def test_healthy_framework_run_has_no_false_medium_or_high_finding(scored, case):
    row = scored[case]
    assert row.get("status") == "ok", _explain(row)
    assert not [w for w in row["why"] if w.startswith("false")], _explain(row)
    assert row["verdict"] == "PASS", _explain(row)


# The bench suite scores the cost within 20 % (docs/findings.md, side by side, repeated);
# here, in CI, the healthy reference is recorded minutes apart under another worker's
# load, so its script-timed gain moves by ~10 ms between the two recordings (41.4 ms
# with the others waiting 52.3 in one CI run). The test guards against a cost that is
# wrong, not noise: within CI_COST_TOLERANCE of the injected time or of that gain.
CI_COST_TOLERANCE = 0.35


def test_slow_compute_rank_under_lightning_is_found_costed_and_not_inverted(scored):
    row = scored["lightning_ddp:slow_compute_rank"]
    assert row.get("status") == "ok", _explain(row)
    # medium or high, naming rank 1 alone (the suite's ACCEPT rule), nothing false, no
    # inversion against the healthy run
    assert row.get("matched", "").startswith("straggler:"), _explain(row)
    assert row["matched"].split(":")[1] in ("medium", "high"), _explain(row)
    assert not [w for w in row["why"] if not w.startswith("cost ")], _explain(row)
    cost = float(row["matched"].split(":")[2].removesuffix("ms"))
    truths = [40.0] + ([row["measured_gain"]] if row.get("measured_gain") else [])
    assert any(abs(cost - t) <= CI_COST_TOLERANCE * t for t in truths), _explain(row)
