"""gpudiag installed the ordinary way: a wheel built from the sources, and `pip install .`,
each into a fresh virtual environment, used from a directory outside the checkout.

The environments see the packages of the interpreter running the tests (torch,
streamlit... are not downloaded again), whether it is a virtual environment or not: a
.pth file lists its site-packages after the environment's own, so each environment
imports its own gpudiag (the test checks which one). Nothing from the checkout is on the
path (no PYTHONPATH, cwd a temporary directory).
"""

from __future__ import annotations

import os
import shutil
import signal
import site
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHIPPED = ("pyproject.toml", "README.md", "gpudiag", "dashboards", "sample_runs")
STEP_TIMEOUT_S = 300

pytestmark = pytest.mark.slow


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _run(args: list[str | Path], cwd: Path, **kw: object) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=STEP_TIMEOUT_S,
        **kw,  # type: ignore[arg-type]
    )


def _ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, (proc.args, proc.stdout[-3000:], proc.stderr[-3000:])
    return proc


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The files a distribution is built from, copied: the build leaves the checkout alone."""
    src = tmp_path_factory.mktemp("src")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    for name in SHIPPED:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=ignore)
        else:
            shutil.copy2(path, src / name)
    return src


def _running_site_dirs() -> list[str]:
    """The site-packages the interpreter running the tests imports from: a virtual
    environment's own (``--system-site-packages`` would give only its base's)."""
    dirs = list(site.getsitepackages())
    user = site.getusersitepackages()
    if site.ENABLE_USER_SITE and os.path.isdir(user):
        dirs.append(user)
    return dirs


def _venv(root: Path) -> Path:
    """A fresh environment over the running interpreter's packages; pip comes from them."""
    _ok(_run([sys.executable, "-m", "venv", "--without-pip", root], root.parent))
    python = root / "bin" / "python"
    code = "import site; print(site.getsitepackages()[0])"
    own = Path(_ok(_run([python, "-c", code], root.parent)).stdout.strip())
    # a .pth's folders come after the environment's own site-packages (its gpudiag wins);
    # .pth files in them are not read (the running interpreter's editable gpudiag is not)
    (own / "running_interpreter.pth").write_text("\n".join(_running_site_dirs()) + "\n")
    return python


@pytest.fixture(scope="module")
def wheel(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    _ok(
        _run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
             "-w", dist, source],
            dist,
        )
    )  # fmt: skip
    (found,) = dist.glob("gpudiag-*.whl")
    return found


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """bin/ of an environment with the wheel installed."""
    python = _venv(tmp_path_factory.mktemp("wheelenv") / "venv")
    _ok(_run([python, "-m", "pip", "install", "--no-deps", wheel], wheel.parent))
    return python.parent


@pytest.fixture()
def cwd(tmp_path: Path) -> Path:
    return tmp_path


def _site_gpudiag(bin_dir: Path, cwd: Path) -> Path:
    proc = _ok(_run([bin_dir / "python", "-c", "import gpudiag; print(gpudiag.__file__)"], cwd))
    return Path(proc.stdout.strip()).parent


def test_wheel_holds_every_module_the_dashboard_and_the_sample_runs(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {
        p.relative_to(REPO).as_posix()
        for p in (REPO / "gpudiag").rglob("*.py")
        if "__pycache__" not in p.parts
    }
    expected |= {
        "gpudiag/dashboards/" + p.relative_to(REPO / "dashboards").as_posix()
        for p in (REPO / "dashboards").rglob("*.py")
        if "__pycache__" not in p.parts
    }
    expected |= {
        "gpudiag/sample_runs/" + p.relative_to(REPO / "sample_runs").as_posix()
        for p in (REPO / "sample_runs").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    expected.add("gpudiag/py.typed")
    assert sorted(expected - names) == []
    assert not [n for n in names if n.startswith(("tests/", "dashboards/", "sample_runs/"))]
    entry = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "gpudiag = gpudiag.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()


def test_analyze_defaults_to_the_shipped_sample_runs(installed: Path, cwd: Path) -> None:
    package = _site_gpudiag(installed, cwd)
    assert package.is_relative_to(installed.parent), package  # the wheel's, not the checkout's
    proc = _ok(_run([installed / "gpudiag", "analyze"], cwd))
    assert f"shipped sample runs in {package / 'sample_runs'}" in proc.stderr
    for run in ("ddp2_healthy", "ddp2_dataloader_bound", "ddp4_straggler"):
        assert run in proc.stderr and run in proc.stdout
    assert "Traceback" not in proc.stderr


def test_lint_from_the_wheel(installed: Path, cwd: Path) -> None:
    script = cwd / "train.py"
    script.write_text("import torch\nmodel = torch.nn.DataParallel(torch.nn.Linear(2, 2))\n")
    proc = _run([installed / "gpudiag", "lint", script], cwd)
    assert proc.returncode == 1, proc.stderr
    assert f"{script}:2:9 GD101" in proc.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_dashboard_from_the_wheel_answers_its_health_check(installed: Path, cwd: Path) -> None:
    package = _site_gpudiag(installed, cwd)
    port = _free_port()
    proc = subprocess.Popen(
        [str(installed / "gpudiag"), "dashboard", "--port", str(port)],
        cwd=cwd,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + STEP_TIMEOUT_S
        line = ""
        assert proc.stdout is not None
        while time.monotonic() < deadline and "gpudiag dashboard: http" not in line:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
        assert f"gpudiag dashboard: http://127.0.0.1:{port}" in line, proc.poll()
        url = f"http://127.0.0.1:{port}/_stcore/health"
        with urllib.request.urlopen(url, timeout=30) as resp:
            assert resp.read().strip() == b"ok"
        # the server runs the wheel's app on the wheel's sample runs
        ps = _ok(_run(["ps", "-ww", "-o", "args=", "--ppid", str(proc.pid)], cwd)).stdout
        assert str(package / "dashboards" / "app.py") in ps
        assert str(package / "sample_runs") in ps
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]


def test_the_wheels_dashboard_app_renders(installed: Path, cwd: Path) -> None:
    """The app script, run by Streamlit's AppTest inside the environment: it imports its
    modules as gpudiag.dashboards and opens the first shipped sample run."""
    package = _site_gpudiag(installed, cwd)
    code = (
        "import sys\n"
        "from streamlit.testing.v1 import AppTest\n"
        f"sys.argv = ['app.py']\n"
        f"at = AppTest.from_file({str(package / 'dashboards' / 'app.py')!r}, default_timeout=240)\n"
        "at.run()\n"
        "assert not at.exception, [e.value for e in at.exception]\n"
        "mods = sorted(m for m in sys.modules if 'dashboards' in m)\n"
        "print(mods)\n"
    )
    proc = _ok(_run([installed / "python", "-c", code], cwd))
    assert "'gpudiag.dashboards.views'" in proc.stdout
    assert "'dashboards" not in proc.stdout  # never under a second, top-level name


def test_readme_install_command_without_editable(source: Path, tmp_path: Path) -> None:
    """README's first command, `pip install . && gpudiag analyze`, with a non-editable
    install (deps are the system's: --no-deps keeps the test offline)."""
    python = _venv(tmp_path / "venv")
    _ok(_run([python, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "."], source))
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    package = _site_gpudiag(python.parent, cwd)
    assert package.is_relative_to(tmp_path / "venv"), package
    proc = _ok(_run([python.parent / "gpudiag", "analyze"], cwd))
    assert f"shipped sample runs in {package / 'sample_runs'}" in proc.stderr


def test_editable_install_uses_the_checkouts_folders(source: Path, tmp_path: Path) -> None:
    """CI's `pip install -e .`: the package, dashboards/ and sample_runs/ are the sources'."""
    python = _venv(tmp_path / "venv")
    _ok(
        _run(
            [python, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-e", "."], source
        )
    )
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    code = (
        "from gpudiag import paths; print(paths.dashboards_dir()); print(paths.sample_runs_dir())"
    )
    proc = _ok(_run([python, "-c", code], cwd))
    assert proc.stdout.split() == [str(source / "dashboards"), str(source / "sample_runs")]
    assert _site_gpudiag(python.parent, cwd) == source / "gpudiag"
    proc = _ok(_run([python.parent / "gpudiag", "lint", "--list-rules"], cwd))
    assert "GD101" in proc.stdout
