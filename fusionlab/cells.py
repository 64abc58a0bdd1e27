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
notebook's recorded wall time says how much of its grid came from the cache (a resumed run costs less). Likewise
FUSIONLAB_CELL_PROGRESS: each finished batch of a grid appends `{"desc": ..., "done": k, "total": n}`, which the lab
command prints while the notebook cell is still running.

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
from typing import Any, Callable, Hashable, Iterator, TypeVar

from tqdm.auto import tqdm

from .errors import ContextTooLong, FusionLabError

M = TypeVar("M")


def cell_key(*parts: Any) -> str:
    """A stable key from JSON-serialisable parts (order matters)."""
    return hashlib.sha256(json.dumps(parts, ensure_ascii=False, sort_keys=True, default=str).encode()).hexdigest()


class CellCache:
    """`cache = CellCache(path)`; `key in cache`; `cache[key]`; `cache.add(record)` (record holds its "key")."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if self.path.is_dir():
            raise FusionLabError(f"cell cache path {self.path} is a directory; pass a file path such as "
                                 f"{self.path / 'cells.jsonl'}.")
        parent = next((a for a in self.path.parents if a.exists()), Path("/"))
        if not parent.is_dir() or not os.access(self.path if self.path.exists() else parent, os.W_OK):
            raise FusionLabError(f"cell cache path {self.path} is not writable ({parent} is not a writable "
                                 "folder); point the cache at a writable folder (FUSIONLAB_HOME) or fix the "
                                 "permissions.")
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


PROGRESS_ENV = "FUSIONLAB_CELL_PROGRESS"
RAY_ENV = "FUSIONLAB_RAY"
"""Global state: when set ('local' or a cluster address), every `run_cells` call computes its missing cells on Ray
(`fusionlab.lab.ray_cells`); `fusionlab lab --ray` and `ray_cells.on_ray()` set it. Unset: in-process."""


@dataclass(frozen=True)
class CellJob:
    """What computing a grid's cells needs, on whichever back end: how to open the model once, how to compute one
    cell or a batch, which errors mean "this cell cannot run". The one batching rule both back ends follow."""

    open_model: Callable[[], AbstractContextManager[Any]]
    compute: Callable[[Any, Cell], dict[str, Any]]
    compute_batch: Callable[[Any, list[Cell]], list[dict[str, Any]]] | None = None
    batch_size: int = 1
    skip: tuple[type[Exception], ...] = (ContextTooLong,)
    chain: Callable[[Cell], Hashable] | None = None
    """Cells that continue one another (a growing training run, resumed from its checkpoint at each budget) share a
    chain key: they stay in order in one group, so a Ray worker runs them one after another, never two at once."""
    streams: bool = False
    """compute_batch(model, cells, emit) calls emit(j, record) the moment cell j finishes (a continuous-batching grid:
    when its row ends). In-process, every missing cell is then one batch, each record saved as it is emitted: the
    scheduler refills a freed seat until the grid's last prompt, never waiting for a group's longest row."""

    def groups(self, todo: list[Cell], spread: int = 1, streaming: bool = False) -> list[list[Cell]]:
        """Batches of at most `batch_size` cells, and at least `spread` of them where the cells allow (so that many
        workers each get one: rows of a batch equal their prompt run alone, so smaller batches change no record).
        `streaming`: the caller saves records as they are emitted, so a streaming job is one batch of every cell."""
        if streaming and self.streams and self.compute_batch is not None:
            return [todo]
        if self.chain is not None:
            chains: dict[Hashable, list[Cell]] = {}
            for c in todo:
                chains.setdefault(self.chain(c), []).append(c)
            return list(chains.values())
        step = min(self.batch_size, -(-len(todo) // max(spread, 1))) if self.compute_batch is not None else 1
        return [todo[at:at + step] for at in range(0, len(todo), step)]

    def compute_group(self, model: Any, group: list[Cell],
                      emit: Callable[[int, dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
        """Records for one group, each also handed to `emit(j, record)` once, as soon as it exists (a streaming
        batch: when its row ends; otherwise when the batch returns). A batch that raises one of `skip` is redone cell
        by cell for the cells it had not finished, so only the cells that really cannot run are recorded as skipped
        (with the message)."""
        recs: dict[int, dict[str, Any]] = {}

        def keep(j: int, rec: dict[str, Any]) -> None:
            if j not in recs:
                recs[j] = rec
                if emit is not None:
                    emit(j, rec)

        if self.compute_batch is not None and len(group) > 1:
            try:
                out = self.compute_batch(model, group, keep) if self.streams else self.compute_batch(model, group)
                for j, rec in enumerate(out):
                    keep(j, rec)
                return [recs[j] for j in range(len(group))]
            except self.skip:
                pass  # some cell of the batch cannot run: find which, one by one (the finished ones are kept)
        for j, c in enumerate(group):
            if j in recs:
                continue
            try:
                keep(j, self.compute(model, c))
            except self.skip as e:
                keep(j, {"skipped": str(e)})
        return [recs[j] for j in range(len(group))]


def run_cells(cache: CellCache, cells: list[Cell], open_model: Callable[[], AbstractContextManager[M]],
              compute: Callable[[M, Cell], dict[str, Any]], desc: str,
              skip: tuple[type[Exception], ...] = (ContextTooLong,),
              compute_batch: Callable[[M, list[Cell]], list[dict[str, Any]]] | None = None,
              batch_size: int = 1, batch_key: Callable[[Cell], Any] | None = None,
              backend: str | None = None, chain: Callable[[Cell], Hashable] | None = None,
              streams: bool = False) -> list[dict[str, Any]]:
    """Compute the cells the cache lacks, appending each as it finishes, and return every cell's record in order.

    The model is opened once, and only if some cell is missing (a finished grid loads nothing). With
    `compute_batch`, missing cells go `batch_size` at a time (`CellJob.compute_group`).
    `batch_key` orders the missing cells before batching (e.g. by length: less padding); results keep `cells` order.
    `chain`: cells with one chain key run in order as one group (`CellJob.chain`; not with `compute_batch`).
    `streams`: `compute_batch` takes a third argument, `emit`, and emits each cell as it finishes (`CellJob.streams`);
    in-process every missing cell is one batch and each record is appended the moment it is emitted.
    `backend`: 'inprocess' or 'ray' (default: 'ray' when $FUSIONLAB_RAY is set, else 'inprocess'). On Ray the
    workers compute and this process alone writes the cache, so resume and the tally behave the same.
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise FusionLabError(f"batch_size must be a positive int, got {batch_size!r}.")
    if chain is not None and compute_batch is not None:
        raise FusionLabError("run_cells: `chain` (cells that continue one another) and `compute_batch` exclude each "
                             "other; a chained grid computes cell by cell.")
    where = backend if backend is not None else ("ray" if os.environ.get(RAY_ENV) else "inprocess")
    if where not in RUNNERS:
        raise FusionLabError(f"backend must be one of {sorted(RUNNERS)}, got {where!r} (the 'ray' back end is "
                             "registered by `import fusionlab`).")
    todo = [c for c in cells if c.key not in cache]
    if batch_key is not None:
        todo.sort(key=batch_key)
    if todo:
        RUNNERS[where](cache, todo, CellJob(open_model, compute, compute_batch, batch_size, skip, chain, streams), desc)
    _tally(desc, cached=len(cells) - len(todo), computed=len(todo))
    # the key names the computation, the fields only label it: a result cached under another label (a setting
    # renamed since, or the same computation shared by two notebooks) comes back under this caller's labels
    return [{**cache[c.key], **c.fields} for c in cells]


def _run_here(cache: CellCache, todo: list[Cell], job: CellJob, desc: str) -> None:
    with job.open_model() as model, tqdm(total=len(todo), desc=desc, leave=False) as bar:
        for group in job.groups(todo, streaming=True):
            def save(j: int, rec: dict[str, Any], group: list[Cell] = group) -> None:  # as each cell finishes
                cache.add({"key": group[j].key, **group[j].fields, **rec})
                bar.update(1)
                report_progress(desc, bar.n, len(todo))
            job.compute_group(model, group, save)


RUNNERS: dict[str, Callable[[CellCache, list[Cell], CellJob, str], None]] = {"inprocess": _run_here}
"""Global state: back end name -> how it computes a grid's missing cells. `fusionlab.lab.ray_cells` adds 'ray'."""


def report_progress(desc: str, done: int, total: int) -> None:
    """One line per finished batch to $FUSIONLAB_CELL_PROGRESS, if set: the lab command reads it while a notebook
    cell runs, to show where a long grid is (see the module docstring)."""
    path = os.environ.get(PROGRESS_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"desc": desc, "done": done, "total": total}) + "\n")


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
