"""A learned fuser's training step vs a plain master forward + backward on the same tokens (issue #17's target:
<= 1.5x), side by side (benchmarks/paired.py), plus training tokens/s and the process's peak memory.

The plain step: the master's loss with a gradient to its input embeddings (so backward runs through every layer, as it
must for the fuser); the fused step: train_fuser's own loss_of with a blend fuser (SmolLM2 -> Qwen), backward into the
fuser. Writes benchmarks/results/train.json. Usage: python benchmarks/bench_train.py [--tokens 256]
"""
from __future__ import annotations

import argparse
import json
import resource
from pathlib import Path

import torch
import torch.nn.functional as F

import fusionlab as fl
from fusionlab.training.fuser import FuserConfig, LearnedFuser
from fusionlab.training.chunks import TrainChunk, loss_of, prepare
from fusionlab.experiments import nb07_corpora as corpora

from fusionlab.analysis.paired_timing import paired_ratio

OUT = Path(__file__).parent / "results"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--max-reps", type=int, default=20)
    args = ap.parse_args()
    m, s = fl.load("qwen2.5-coder-0.5b-instruct"), fl.load("smollm2-135m-instruct")
    for p in list(m.model.parameters()) + list(s.model.parameters()):
        p.requires_grad_(False)
    proj = fl.fit_lstsq(m, s)
    fuser = LearnedFuser(proj, FuserConfig(width=32))
    with torch.no_grad():  # a fuser mid-training: nonzero residual outputs
        for name, p in fuser.named_parameters():
            if name.endswith(".b"):
                p.normal_(0, 0.02)
    text = corpora.chunks(m.tokenizer, corpora.documents(), "train", args.tokens)[0].text
    with fl.fuse(m, [fl.Slave(s, layer_map=fuser.layer_map, projector=fuser, mode="blend", align="mean")]) as f:
        p = prepare(f, [TrainChunk(text)], "same", [0])[0]
        ids = p.ids

        def plain() -> None:
            emb = m.model.get_input_embeddings()(ids).detach().requires_grad_(True)
            logits = m.model(inputs_embeds=emb, use_cache=False).logits
            F.cross_entropy(logits[0, :-1], ids[0, 1:]).backward()

        def fused() -> None:
            fuser.zero_grad(set_to_none=True)
            loss_of(f, fuser, p).backward()

        r = paired_ratio(plain, fused, min_reps=5, max_reps=args.max_reps, halfwidth=0.03)
    res = {"tokens": int(ids.shape[1]), "train_over_plain": r, "train_tokens_per_s": ids.shape[1] / r["b_median_s"],
           "plain_tokens_per_s": ids.shape[1] / r["a_median_s"],
           "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
           "trainable_params": fuser.param_count(), "threads": torch.get_num_threads(), "torch": torch.__version__}
    OUT.mkdir(exist_ok=True)
    (OUT / "train.json").write_text(json.dumps(res, indent=2))
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
