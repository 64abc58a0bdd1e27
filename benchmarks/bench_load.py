"""First load from GGUF vs cached reload, per embedded model (issue #2).

The first-load numbers come from the conversion manifests `fusionlab fetch` wrote (tokenizer + model from
GGUF); with --reconvert they are re-measured now (slow). Cached reloads are timed here in fresh processes.
Writes benchmarks/results/load.json.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from fusionlab.models import zoo

OUT = Path(__file__).parent / "results"
TIMER = "import time, fusionlab as fl; t=time.perf_counter(); fl.load({name!r}); print(time.perf_counter()-t)"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reconvert", action="store_true")
    args = ap.parse_args()
    rows = []
    for name, entry in zoo.EMBEDDED.items():
        manifest = zoo.convert(entry) if args.reconvert else (zoo.cached_manifest(name) or zoo.fetch([name])[name])
        runs = [float(subprocess.run([sys.executable, "-c", TIMER.format(name=name)], capture_output=True,
                                     text=True, check=True).stdout.strip().splitlines()[-1]) for _ in range(3)]
        rows.append({"name": name, "gguf_tokenizer_load_s": manifest["gguf_tokenizer_load_s"],
                     "gguf_model_load_s": manifest["gguf_model_load_s"], "cached_load_s": sorted(runs)[1]})
        print(rows[-1], flush=True)
    OUT.mkdir(exist_ok=True)
    (OUT / "load.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
