"""`gpudiag trace -m pkg.module` where pkg is found by an import hook, not by a folder on
sys.path: what `pip install -e .` of a research repo installs (setuptools' editable
finder, a `sys.meta_path` entry that maps the name to the checkout). The launcher said
"No module named" of it from any other folder, and linted nothing. The hook here is a
sitecustomize that does what the editable finder does, in the launcher and in the rank."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

HOOK = """
import importlib.machinery, importlib.util, sys

class EditableFinder:  # like setuptools' __editable___*_finder: name -> checkout
    MAPPING = {"hookedpkg": %r}

    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname in cls.MAPPING:
            root = cls.MAPPING[fullname]
            return importlib.util.spec_from_file_location(
                fullname, root + "/__init__.py", submodule_search_locations=[root]
            )
        return None

sys.meta_path.append(EditableFinder)
"""

TRAIN = """
import torch

model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    opt.zero_grad()
    model(torch.randn(8, 4)).sum().backward()
    opt.step()
loss = model(torch.randn(8, 4)).sum()
print("trained", loss.item())
"""


@pytest.fixture
def hooked_package(tmp_path: Path) -> dict[str, str]:
    checkout = tmp_path / "checkout" / "src" / "hookedpkg"
    checkout.mkdir(parents=True)
    (checkout / "__init__.py").write_text("")
    (checkout / "train.py").write_text(textwrap.dedent(TRAIN))
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(HOOK % str(checkout))
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH", "")]))
    return dict(os.environ, PYTHONPATH=path, PYTHONUNBUFFERED="1")


def _trace(env: dict[str, str], cwd: Path, module: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpudiag", "trace", "--out", str(cwd / "run"), "-m", module],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_module_an_import_hook_finds_is_traced_and_linted(hooked_package, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = _trace(hooked_package, elsewhere, "hookedpkg.train")
    assert done.returncode == 0, done.stderr
    assert "trained" in done.stdout
    assert "No module named" not in done.stderr
    lint = json.loads((elsewhere / "run" / "lint.json").read_text())
    assert [Path(f).name for f in lint["files"]] == ["train.py"], lint


def test_module_nothing_finds_is_still_refused_in_one_line(hooked_package, tmp_path):
    done = _trace(hooked_package, tmp_path, "hookedpkg_absent.train")
    assert done.returncode != 0
    assert done.stderr.strip() == "gpudiag: trace: No module named hookedpkg_absent.train"
