"""The one resumable cell cache every grid uses (NIAH, HumanEval, context offload, fuser evaluations, ...).

A grid is a list of cells; a cell's result is a small JSON record. Finished cells are appended to a JSONL file as
they finish, so an interrupted run resumes where it stopped and a finished grid re-reads in milliseconds.

File schema (one JSON object per line, UTF-8):

    {"key": "<64 hex>", ...the experiment's own fields...}
    {"key": "<64 hex>", "skipped": "<why>", ...}        a cell that cannot run (e.g. ContextTooLong), kept so
                                                        a re-run neither retries it nor rebuilds its setting

`key` is `cell_key(...)`: the sha256 of everything that changes the cell's result (models' fingerprints, setting,
text, lengths, decoding options). If a key occurs twice the later line wins.

Global state: when the environment variable FUSIONLAB_CELL_TALLY names a file, every `run_cells` call appends one
line to it, `{"desc": ..., "cached": n, "computed": n}`. `fusionlab lab` sets it for each notebook's kernel, so a
notebook's recorded wall time says how much of its grid came from the cache (a resumed run costs less).

Writes are atomic per line: each record is one `write()` of a whole line, under an exclusive `flock`, so two
processes appending to one cache never interleave. A line cut short by a killed process (no newline, or not JSON)
is ignored on reading with a warning that names the file; the next append starts on a fresh line, so the cut
fragment never corrupts a good record.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import warnings
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

from .errors import ContextTooLong, FusionLabError

M = TypeVar("M")


def cell_key(*parts: Any) -> str:
    """A stable key from JSON-serialisable parts (order matters)."""
    return hashlib.sha256(json.dumps(parts, ensure_ascii=False, sort_keys=True, default=str).encode()).hexdigest()


class CellCache:
    """`cache = CellCache(path)`; `key in cache`; `cache[key]`; `cache.add(record)` (record holds its "key")."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._done: dict[str, dict[str, Any]] = self._read()

    def _read(self) -> dict[str, dict[str, Any]]:
        if not self.path.exists():
            return {}
        done, bad = {}, 0
        with self.path.open("rb") as f:
            for raw in f:
                try:
                    if not raw.endswith(b"\n"):
                        raise ValueError("no newline: cut short")
                    rec = json.loads(raw)
                    done[rec["key"]] = rec
                except (ValueError, KeyError, TypeError):
                    bad += 1 if raw.strip() else 0
        if bad:
            warnings.warn(f"{self.path}: ignored {bad} unreadable line(s) (a run killed mid-write?); those cells "
                          "will be computed again.", stacklevel=3)
        return done

    def __contains__(self, key: str) -> bool:
        return key in self._done

    def __getitem__(self, key: str) -> dict[str, Any]:
        return self._done[key]

    def __len__(self) -> int:
        return len(self._done)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self._done.values())

    def missing(self, keys: list[str]) -> list[str]:
        return [k for k in keys if k not in self._done]

    def add(self, record: dict[str, Any]) -> None:
        """Append one finished cell (atomically, under a file lock) and remember it."""
        if not isinstance(record.get("key"), str):
            raise FusionLabError(f"a cell record needs a string 'key'; got {record.get('key')!r}.")
        line = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                line = b"\n" + line  # a fragment left by a killed writer stays a line of its own
            while line:  # one write() in practice; loop only if the OS writes part of it
                line = line[os.write(fd, line):]
        finally:
            os.close(fd)  # closing releases the lock
        self._done[record["key"]] = record


@dataclass(frozen=True)
class Cell:
    """One cell of a grid: its cache key, the fields saved with its result, and what computing it needs."""

    key: str
    fields: dict[str, Any]
    """Identifying fields stored with the result (setting, needle, length, task id, ...)."""
    item: Any = field(default=None, compare=False)
    """Whatever `compute` needs (a needle, a task); not stored."""


def run_cells(cache: CellCache, cells: list[Cell], open_model: Callable[[], AbstractContextManager[M]],
              compute: Callable[[M, Cell], dict[str, Any]], desc: str,
              skip: tuple[type[Exception], ...] = (ContextTooLong,),
              compute_batch: Callable[[M, list[Cell]], list[dict[str, Any]]] | None = None,
              batch_size: int = 1, batch_key: Callable[[Cell], Any] | None = None) -> list[dict[str, Any]]:
    """Compute the cells the cache lacks, appending each as it finishes, and return every cell's record in order.

    The model is opened once, and only if some cell is missing (a finished grid loads nothing). With
    `compute_batch`, missing cells go `batch_size` at a time; a batch that raises one of `skip` is redone cell by cell,
    so only the cells that really cannot run are recorded as skipped (with the message), never retried.
    `batch_key` orders the missing cells before batching (e.g. by length: less padding); results keep `cells` order.
    """
    from tqdm.auto import tqdm

    if not isinstance(batch_size, int) or batch_size < 1:
        raise FusionLabError(f"batch_size must be a positive int, got {batch_size!r}.")
    todo = [c for c in cells if c.key not in cache]
    if batch_key is not None:
        todo.sort(key=batch_key)
    if todo:
        with open_model() as model, tqdm(total=len(todo), desc=desc, leave=False) as bar:
            step = batch_size if compute_batch is not None else 1
            for at in range(0, len(todo), step):
                group = todo[at:at + step]
                recs = None
                if compute_batch is not None and len(group) > 1:
                    try:
                        recs = compute_batch(model, group)
                    except skip:
                        recs = None  # some cell of the batch cannot run: find which, one by one
                if recs is None:
                    recs = []
                    for c in group:
                        try:
                            recs.append(compute(model, c))
                        except skip as e:
                            recs.append({"skipped": str(e)})
                for c, rec in zip(group, recs):
                    cache.add({"key": c.key, **c.fields, **rec})
                bar.update(len(group))
    _tally(desc, cached=len(cells) - len(todo), computed=len(todo))
    # the key names the computation, the fields only label it: a result cached under another label (a setting
    # renamed since, or the same computation shared by two notebooks) comes back under this caller's labels
    return [{**cache[c.key], **c.fields} for c in cells]


def _tally(desc: str, cached: int, computed: int) -> None:
    """One line per grid to $FUSIONLAB_CELL_TALLY, if set (see the module docstring)."""
    path = os.environ.get("FUSIONLAB_CELL_TALLY")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"desc": desc, "cached": cached, "computed": computed}) + "\n")


def read_tally(path: str | Path) -> dict[str, int]:
    """Cells served from the cache and computed, summed over every grid a tally file records."""
    got = {"cached": 0, "computed": 0}
    if Path(path).exists():
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            rec = json.loads(line)
            got = {k: got[k] + int(rec[k]) for k in got}
    return got
