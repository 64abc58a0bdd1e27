"""A grid's missing cells computed on Ray (the optional extra `.[ray]`): `run_cells` comes here when $FUSIONLAB_RAY
is set (`fusionlab lab --ray [ADDRESS]`, or `with on_ray(): ...` in a notebook), or when called with backend="ray".

Workers are Ray actors (`CellWorker`): each opens a grid's model once (`CellJob.open_model`) and keeps it while
cells of that grid arrive in batches (`CellJob.compute_group`, the same rule as in-process); only this process, the
driver, writes the cell cache, so resume, idempotence and the tally are exactly as in-process. A worker killed
mid-batch is restarted by Ray and its batch re-run; the driver records a batch once, when it comes back.

Models travel by recipe, not by weight: an LM that `fl.load` or `sibling` made (and nothing changed since,
`LM.rebuild_recipe`) is rebuilt on the worker, once per worker process; any other LM is sent by value.

Global state, documented: `_POOL` (the driver's actors, made on first use and kept for the process: a notebook's
grids share them), `_MODELS` (a worker's rebuilt LMs, by recipe), and `cells.RUNNERS["ray"]`, registered when this
module is imported (`import fusionlab` does; Ray itself is imported only when a grid asks for it).
"""
from __future__ import annotations

import os
import socket
import time
import uuid
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import torch
from tqdm.auto import tqdm

from ..cells import RAY_ENV, RUNNERS, Cell, CellCache, CellJob, report_progress
from ..engine.lm import LM
from ..errors import FusionLabError
from ..models.rebuild import rebuild

INSTALL = "pip install 'fusionlab[ray]' (in a clone: .venv/bin/pip install -e '.[ray]')"
WORKER_SETUP = "`fusionlab fetch` on every node (or `python3 fusionlab/bootstrap.py lab` in its clone)"
CPUS_ENV, GPUS_ENV = "FUSIONLAB_RAY_CPUS", "FUSIONLAB_RAY_GPUS"
CONNECT_TIMEOUT_S = 3.0

_POOL: list[Any] = []
_MODELS: dict[str, LM] = {}


@dataclass(frozen=True)
class RaySettings:
    address: str = "local"
    """'local' (start or join a Ray instance on this machine) or a cluster address ('host:port', 'ray://host:port')."""
    cpus_per_worker: int = 1
    """CPU cores per actor; torch in that actor uses this many threads."""
    gpus_per_worker: int = 0
    """GPUs per actor (1: one actor per GPU, models on 'cuda')."""

    @classmethod
    def from_env(cls) -> RaySettings:
        def count(var: str, default: int) -> int:
            raw = os.environ.get(var, str(default))
            if not raw.isdigit():
                raise FusionLabError(f"${var} must be a whole number, got {raw!r}.")
            return int(raw)
        return cls(os.environ.get(RAY_ENV) or "local", count(CPUS_ENV, 1), count(GPUS_ENV, 0))


@contextmanager
def on_ray(address: str = "local", cpus_per_worker: int = 1, gpus_per_worker: int = 0) -> Iterator[RaySettings]:
    """`with on_ray(): ...` runs every grid inside on Ray (sets $FUSIONLAB_RAY and friends, restores them after)."""
    require_ray()
    for name, v, low in (("cpus_per_worker", cpus_per_worker, 1), ("gpus_per_worker", gpus_per_worker, 0)):
        if not isinstance(v, int) or isinstance(v, bool) or v < low:
            raise FusionLabError(f"on_ray({name}=...) needs a whole number >= {low}, got {v!r}.")
    new = {RAY_ENV: address, CPUS_ENV: str(cpus_per_worker), GPUS_ENV: str(gpus_per_worker)}
    old = {k: os.environ.get(k) for k in new}
    os.environ.update(new)
    try:
        yield RaySettings(address, cpus_per_worker, gpus_per_worker)
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


def require_ray() -> Any:
    """Ray itself, imported on first use: the optional extra, which the in-process lab never imports."""
    try:
        import ray
    except ImportError as e:
        raise FusionLabError(f"running grids on Ray needs Ray, which is not installed: {INSTALL}.") from e
    return ray


def check_reachable(address: str) -> None:
    """Fail within seconds on an address nobody answers (ray.init alone can wait much longer)."""
    hostport = address.removeprefix("ray://")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise FusionLabError(f"Ray address {address!r} is not 'host:port' or 'ray://host:port' (or 'local').")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise FusionLabError(f"cannot reach a Ray cluster at {address!r} ({e.__class__.__name__}: {e}); start one "
                             "there with `ray start --head`, or use FUSIONLAB_RAY=local.") from e


def connect(s: RaySettings) -> None:
    """Join (or start) Ray once per process and teach it to send LMs by recipe."""
    ray = require_ray()
    if not ray.is_initialized():
        if s.address == "local":
            ray.init(include_dashboard=False, log_to_driver=False)
        else:
            check_reachable(s.address)
            ray.init(address=s.address, log_to_driver=False)
    ray.util.register_serializer(LM, serializer=lm_to_wire, deserializer=lm_from_wire)


# --- models on the wire -----------------------------------------------------------------------------------------
def lm_to_wire(lm: LM) -> dict[str, Any]:
    how = lm.rebuild_recipe()
    if how is None:
        return {"value": (lm.model, lm.tokenizer, lm.name, lm.source, lm.source_sha256, lm.extra)}
    # the weights' hash, when the driver already computed it: the worker's copy must match
    return {"recipe": how, "name": lm.name, "fingerprint": lm.__dict__.get("fingerprint")}


def lm_from_wire(wire: dict[str, Any]) -> LM:
    if "value" in wire:
        return LM(*wire["value"])
    gpu = bool(require_ray().get_gpu_ids())
    how = on_gpu(wire["recipe"]) if gpu else wire["recipe"]
    key = repr(how)
    if key not in _MODELS:
        try:
            _MODELS[key] = rebuild(how)
            if gpu:
                _MODELS[key].model.to("cuda")
        except FusionLabError as e:
            raise FusionLabError(f"a Ray worker on {socket.gethostname()} could not make model {wire['name']!r}: "
                                 f"{e} Every worker needs FusionLab and the embedded models: {WORKER_SETUP}.") from e
    lm = _MODELS[key]
    if wire["fingerprint"] is not None and lm.fingerprint != wire["fingerprint"]:
        raise FusionLabError(f"model {wire['name']!r} on the Ray worker {socket.gethostname()} has other weights than "
                             f"the driver's ({lm.fingerprint[:12]} vs {wire['fingerprint'][:12]}): install the same "
                             f"FusionLab and models on every node ({WORKER_SETUP}).")
    return lm


def on_gpu(how: dict[str, Any]) -> dict[str, Any]:
    """The same recipe with the weights on the worker's GPU (an actor given `num_gpus` computes there)."""
    if "load" in how:
        return {"load": {**how["load"], "device": "cuda"}}
    if "rope_variant" in how:
        return how  # built on the CPU, moved by lm_from_wire
    return {"sibling": {**how["sibling"], "master": on_gpu(how["sibling"]["master"])}}


# --- the workers --------------------------------------------------------------------------------------------------
class CellWorker:
    """One Ray actor: the open model of the grid it serves now, and the cells it is sent."""

    def __init__(self, threads: int):
        torch.set_num_threads(threads)
        self._job_id: str | None = None
        self._open: Any = None  # the entered context manager
        self._model: Any = None
        self._job: CellJob | None = None

    def pid(self) -> int:
        return os.getpid()

    def run(self, job_id: str, job_box: list[Any], cells: list[Cell]) -> list[dict[str, Any]]:
        """Records of `cells`; opens the grid's model when the job changes (the box keeps Ray from resolving the
        job on every batch)."""
        if job_id != self._job_id:
            self.close()
            self._job = require_ray().get(job_box[0])
            self._open = self._job.open_model()
            self._model = self._open.__enter__()
            self._job_id = job_id
        return self._job.compute_group(self._model, cells)

    def close(self) -> None:
        if self._open is not None:
            self._open.__exit__(None, None, None)
        self._job_id = self._open = self._model = self._job = None


def pool(s: RaySettings) -> list[Any]:
    """The driver's actors: as many as the cluster's resources hold at `s`'s size per actor, made once."""
    connect(s)
    if _POOL:
        return _POOL
    ray = require_ray()
    res = ray.cluster_resources()
    cpus, gpus = int(res.get("CPU", 0)), int(res.get("GPU", 0))
    if s.gpus_per_worker > gpus:
        raise FusionLabError(f"asked for {s.gpus_per_worker} GPU(s) per worker, but the Ray cluster at "
                             f"{s.address!r} has {gpus}; lower ${GPUS_ENV} or add GPU nodes.")
    n = min(cpus // s.cpus_per_worker, gpus // s.gpus_per_worker if s.gpus_per_worker else cpus)
    if n < 1:
        raise FusionLabError(f"the Ray cluster at {s.address!r} has {cpus} CPU(s): no room for one worker of "
                             f"{s.cpus_per_worker}; lower ${CPUS_ENV}.")
    actor = ray.remote(CellWorker).options(num_cpus=s.cpus_per_worker, num_gpus=s.gpus_per_worker,
                                           max_restarts=4, max_task_retries=4)
    _POOL.extend(actor.remote(s.cpus_per_worker) for _ in range(n))
    return _POOL


def shutdown() -> None:
    """Drop the actors (their models go with them); the next grid makes new ones."""
    for a in _POOL:
        require_ray().kill(a)
    _POOL.clear()


def run_on_ray(cache: CellCache, todo: list[Cell], job: CellJob, desc: str) -> None:
    """Send `todo`'s batches to free workers, record each batch as it returns (this process alone writes the
    cache), with one bar over the grid and each worker's throughput."""
    ray, workers = require_ray(), pool(RaySettings.from_env())
    job_id, box = uuid.uuid4().hex, [ray.put(job)]
    queue, pending, free = deque(job.groups(todo, spread=len(workers))), {}, list(range(len(workers)))
    done = [0] * len(workers)
    t0 = time.perf_counter()
    with tqdm(total=len(todo), desc=f"{desc} (Ray, {len(workers)} workers)", leave=False) as bar:
        while queue or pending:
            while free and queue:
                w, group = free.pop(), queue.popleft()
                pending[workers[w].run.remote(job_id, box, group)] = (w, group)
            [ref], _ = ray.wait(list(pending), num_returns=1)
            w, group = pending.pop(ref)
            try:
                recs = ray.get(ref)
            except ray.exceptions.RayTaskError as e:  # the worker's own exception, not Ray's wrapper
                raise e.as_instanceof_cause() from None
            for c, rec in zip(group, recs):
                cache.add({"key": c.key, **c.fields, **rec})
            done[w] += len(group)
            free.append(w)
            bar.update(len(group))
            report_progress(desc, bar.n, len(todo))
            rate = [n / (time.perf_counter() - t0) for n in done]
            bar.set_postfix_str(" ".join(f"w{k} {r:.2f}/s" for k, r in enumerate(rate)))


RUNNERS["ray"] = run_on_ray
