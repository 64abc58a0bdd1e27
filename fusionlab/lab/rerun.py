"""A rerun of a committed HumanEval grid compared problem by problem with the run an earlier commit saved.

Why from git: a rerun overwrites `<notebook>_humaneval.<size>.csv`, so the earlier run lives only in history. Reading
it back with `git show <commit>:<path>` makes the comparison a command anyone can repeat
(`fusionlab rerun-diff 04 --before a60cb00`) instead of a snippet nobody kept.
"""
from __future__ import annotations

import io
import subprocess
from pathlib import Path

import pandas as pd

from ..errors import FusionLabError
from ..experiments import nb04_humaneval as he
from ..paths import results_dir
from .results import save_table

COLUMN_TYPES = {"before_commit": str}  # a short hash can be all digits (0274500): read it back as text


def table_at_commit(path: Path, commit: str) -> tuple[pd.DataFrame, str]:
    """The CSV at `path` as `commit` saved it, and that commit's short hash (what the README line names: a branch
    name or `HEAD~2` moves, the hash does not)."""
    path = Path(path).resolve()
    try:
        root = subprocess.run(["git", "-C", str(path.parent), "rev-parse", "--show-toplevel"], check=True,
                              capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as e:
        raise FusionLabError(f"{path.parent} is not inside a git clone, so the run that commit {commit!r} saved "
                             "cannot be read: run this from a clone of the repository.") from e
    rel = path.relative_to(Path(root).resolve()).as_posix()
    got = subprocess.run(["git", "-C", root, "show", f"{commit}:{rel}"], capture_output=True, text=True)
    if got.returncode != 0:
        raise FusionLabError(f"before={commit!r}: git has no {rel} at that commit ({got.stderr.strip()}); pass a "
                             f"commit that saved it (git log --oneline -- {rel}).")
    short = subprocess.run(["git", "-C", root, "rev-parse", "--short", commit], check=True, capture_output=True,
                           text=True).stdout.strip()
    return pd.read_csv(io.StringIO(got.stdout)), short


def compare_with_commit(notebook: str, before: str, size: str = "full",
                        folder: Path | None = None) -> tuple[pd.DataFrame, Path]:
    """`humaneval.rerun_changes` between `<notebook>_humaneval.<size>.csv` at commit `before` and the one on disk
    now, saved as `<notebook>_batch_rerun.<size>.csv` (the README's rerun line reads it). Settings only one run has
    are left out: the line names the settings not rerun yet."""
    folder = Path(folder or results_dir())
    now = folder / f"{notebook}_humaneval.{size}.csv"
    if not now.exists():
        raise FusionLabError(f"notebook={notebook!r}, size={size!r}: {now} does not exist; run "
                             f"`fusionlab lab{' --full' if size == 'full' else ''} --only {notebook}` first.")
    (old, commit), new = table_at_commit(now, before), pd.read_csv(now)
    common = set(old["setting"]) & set(new["setting"])
    if not common:
        raise FusionLabError(f"before={before!r}: its {now.name} shares no setting with the one on disk "
                             f"({sorted(set(old['setting']))} vs {sorted(set(new['setting']))}).")
    t = he.rerun_changes(old[old["setting"].isin(common)], new[new["setting"].isin(common)])
    t.insert(1, "before_commit", commit)
    return t, save_table(t, f"{notebook}_batch_rerun.{size}", folder)
