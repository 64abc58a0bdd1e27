"""Cold vs warm time-to-first-token of a fused model, measured in a fresh process (truly cold).

`python -m fusionlab.experiments.nb00_ttft MASTER SLAVE` prints JSON; `measure()` runs that and parses it.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time


PROMPT = "In one sentence, what is a key-value cache in a transformer?"


def _run(master: str, slave: str, warm_runs: int) -> dict:
    # Imported here on purpose: `measure()` runs in the caller's process and must not load torch/transformers;
    # only this function, run in the fresh child process, needs them.
    from ..engine.fit import fit_lstsq
    from ..engine.fuse import fuse
    from ..engine.projector import LstsqProjector
    from ..engine.slave import Slave
    from ..models.zoo import load

    t0 = time.perf_counter()
    m, s = load(master), load(slave)
    load_s = time.perf_counter() - t0
    proj = fit_lstsq(m, s) if m.spec.kv_heads * m.spec.head_dim != s.spec.kv_heads * s.spec.head_dim or \
        m.vocab_hash != s.vocab_hash else "identity"
    align = None if m.vocab_hash == s.vocab_hash else "mean"
    lmap = proj.layer_map if isinstance(proj, LstsqProjector) else None
    with fuse(m, [Slave(s, layer_map=lmap, projector=proj, align=align)]) as f:
        def once() -> float:
            t = time.perf_counter()
            f.generate(PROMPT, max_new_tokens=1, chat=m.spec.has_chat_template)
            return time.perf_counter() - t

        cold = once()
        warm = sorted(once() for _ in range(warm_runs))
    return {"master": master, "slave": slave, "load_s": load_s, "cold_s": cold,
            "warm_median_s": warm[len(warm) // 2], "warm_runs": warm_runs}


def measure(master: str, slave: str, warm_runs: int = 5) -> dict:
    out = subprocess.run([sys.executable, "-m", "fusionlab.experiments.nb00_ttft", master, slave, str(warm_runs)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    print(json.dumps(_run(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 5)))
