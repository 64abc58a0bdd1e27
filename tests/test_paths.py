"""Data paths work from a clone and from an installed wheel (package data), and missing assets say how to fix."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fusionlab import paths
from fusionlab.errors import FusionLabError

ROOT = Path(__file__).resolve().parent.parent


def test_clone_layout():
    assert paths.clone_root() == ROOT
    assert paths.data_dir() == ROOT / "data"
    assert paths.results_dir() == ROOT / "data" / "results"
    assert paths.cache_dir() == ROOT / "data" / "results" / "cache"
    assert paths.figures_dir() == ROOT / "figures" and paths.readme_path() == ROOT / "README.md"
    assert paths.asset("needles.json").is_file() and paths.asset("calibration").is_dir()


def test_home_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("FUSIONLAB_HOME", str(tmp_path))
    assert paths.home() == tmp_path


def test_missing_asset_names_the_fix():
    with pytest.raises(FusionLabError, match="data asset 'no/such.txt' not found.*git checkout -- data/"):
        paths.asset("no", "such.txt")


def test_installed_wheel_finds_its_packaged_data(tmp_path):
    """Build the wheel, install it (no deps) into a bare folder, and read the assets from outside the clone."""
    wheel_dir, target = tmp_path / "wheel", tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(wheel_dir), str(ROOT)], check=True, capture_output=True)
    wheel = next(wheel_dir.glob("fusionlab-*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True, capture_output=True)
    probe = ("import fusionlab.paths as p, fusionlab.engine.fit as f, fusionlab.experiments.nb02_niah as n;"
             "print(p.clone_root(), p.data_dir().name, len(f.calibration_paragraphs()) > 0, len(n.load_needles()),"
             " p.results_dir() == p.home() / 'results')")
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True,
                         env={"PYTHONPATH": str(target), "FUSIONLAB_HOME": str(tmp_path / "home"),
                              "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    root, data, calib, needles, results = out.stdout.split()
    assert (root, data, calib, results) == ("None", "_data", "True", "True") and int(needles) >= 3
