"""The optimisation loop of `train_fuser`: seeded epochs, AdamW + warm-up, clipping, budgets, checkpoints, resume.

Clipping: the residual's parameters by their global norm; a concat gate's gradient elementwise at +-clip, keeping its
sign. At g = 0 that gradient is e^(slot score - own max) times a value difference: for the few queries whose own keys
all score far below the slots (measured on Qwen: own maxima down to -243 at single heads, where a slot at score 0 wins
by e^243) it reaches 1e34 or overflows, and a global clip would then scale every other gradient to nothing. The sign
says whether opening the gate lowers the loss; AdamW steps by about lr either way.

Validation (`eval_every`): the loss on held-out-by-document chunks before the first step, every N steps and at the
end; the fuser returned is the best of those states (the untrained start, equal to the master, is a candidate: a
run whose training gain never shows on validation hands back the master's behaviour, not its overfit). `patience`
passes without a new best stop the run.

A checkpoint holds the fuser's state, the optimizer's, the step, tokens seen, the validation record with the best
state, the random generators and the config hash; it is written to a
temporary file and renamed, so a killed run leaves the previous checkpoint whole. Resuming with a checkpoint of a
different configuration (models, fuser, data, schedule) is refused, naming both hashes.
"""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from ..engine.fuse import FusedModel
from ..engine.kv_capture import capture_kv
from ..errors import FusionLabError
from .chunks import Prepared, loss_of
from .fuser import LearnedFuser


def _rms(x: torch.Tensor) -> torch.Tensor:
    return x.float().pow(2).mean().sqrt()


class TrainingDiverged(FusionLabError):
    """The loss (or the gradient norm) became non-finite, or the loss grew past the divergence bound; the last good
    checkpoint is kept."""


def clip_gradients(gates: list[torch.Tensor], rest: list[torch.Tensor], clip: float) -> float:
    """Gate gradients elementwise at +-clip (an overflowed +-inf is a huge gradient of known sign; nan stays and
    reports nan), the rest by their global norm; returns that norm (inf or nan: the run has diverged)."""
    for g in gates:
        if g.grad is not None:
            g.grad.copy_(torch.nan_to_num(g.grad, nan=float("nan"), posinf=clip, neginf=-clip).clamp_(-clip, clip))
            if not bool(torch.isfinite(g.grad).all()):
                return float("nan")
    return float(torch.nn.utils.clip_grad_norm_(rest, clip)) if rest else 0.0


class Loop:
    def __init__(self, fused: FusedModel, fuser: LearnedFuser, data: list[Prepared], train: Any, cfg_hash: str,
                 checkpoint: Path | None, validation: list[Prepared] | None = None):
        self.fused, self.fuser, self.data, self.train, self.hash, self.ckpt = fused, fuser, data, train, cfg_hash, checkpoint
        self.validation = validation or []
        if train.eval_every is not None and not self.validation:
            raise FusionLabError(f"TrainConfig eval_every={train.eval_every} needs validation chunks: pass "
                                 "validation= to train_fuser (documents disjoint from training and evaluation).")
        self._calibrate()
        self.params = [p for p in fuser.parameters() if p.requires_grad]
        self.gate_params = [p for p in self.params if p is fuser.gate]
        self.rest = [p for p in self.params if p is not fuser.gate]
        opening = [p for p in self.params if p is fuser.gate or p is getattr(fuser, "key_scale", None)]
        others = [p for p in self.params if all(p is not q for q in opening)]
        scale = (train.gate_lr or train.lr) / train.lr  # the gate and key scale may learn faster than the rest
        groups = [{"params": others, "scale": 1.0}] + ([{"params": opening, "scale": scale}] if opening else [])
        self.opt = torch.optim.AdamW(groups, lr=train.lr, weight_decay=train.weight_decay)
        self.step, self.tokens, self.rows = 0, 0, []
        self.evals: list[dict[str, Any]] = []
        """Validation passes: step (updates done), val_loss, val_master (the master alone), val_gain."""
        self.best: dict[str, Any] | None = None
        """The lowest validation loss so far: its step, loss and the fuser's state at that step."""
        self.stopped_early = False

    def _calibrate(self) -> None:
        """Residual input scales and the noise control's statistics, from the training data (no gradient)."""
        rs, f = self.fused.slaves[0], self.fuser
        with torch.no_grad():
            for i in f.layers:
                j = rs.layer_map.pairs[i]
                for kind, attr in (("k", "keys"), ("v", "values")):
                    xs = torch.cat([getattr(p.cap, attr)[j][0].transpose(0, 1).reshape(-1, getattr(p.cap, attr)[j]
                                    .shape[1] * getattr(p.cap, attr)[j].shape[3]) for p in self.data])  # (N, F_s)
                    getattr(f, f"noise_mu_{kind}{i}").copy_(xs.mean(0))
                    getattr(f, f"noise_sd_{kind}{i}").copy_(xs.std(0).clamp_min(1e-6))
                    w = getattr(f, f"base_{kind}{i}")
                    z = xs @ w[:-1] + w[-1]
                    getattr(f, f"scale_{kind}{i}").copy_(z.std(0).clamp_min(1e-6))
                    if kind == "k" and f.config.opening == "log" and f.config.calibrate_keys:
                        f.key_scale0[f.layers.index(i)] = _rms(self._own_keys(i)) / _rms(z).clamp_min(1e-9)

    def _own_keys(self, layer: int) -> torch.Tensor:
        """The master's own pre-RoPE keys at one layer over the training texts, (N, F_m) (computed once)."""
        if not hasattr(self, "_keys"):
            caps = [capture_kv(self.fused.master, p.ids, self.fuser.layers) for p in self.data]
            self._keys = {i: torch.cat([c.keys[i][0].transpose(0, 1).reshape(c.keys[i].shape[2], -1) for c in caps])
                          for i in self.fuser.layers}
        return self._keys[layer]

    def _lr(self) -> float:
        return self.train.lr * min(1.0, (self.step + 1) / max(self.train.warmup, 1))

    def _order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng(self.train.seed + epoch).permutation(len(self.data))

    def _save(self) -> None:
        if self.ckpt is None:
            return
        self.ckpt.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.ckpt.with_suffix(".partial")
        torch.save({"hash": self.hash, "step": self.step, "tokens": self.tokens, "rows": self.rows,
                    "fuser": self.fuser.state_dict(), "opt": self.opt.state_dict(),
                    "noise_rng": self.fuser._noise.get_state(), "torch_rng": torch.get_rng_state(),
                    "evals": self.evals, "best": self.best}, tmp)
        tmp.replace(self.ckpt)

    def _resume(self) -> None:
        if self.ckpt is None or not self.ckpt.exists():
            return
        try:
            state = torch.load(self.ckpt, weights_only=False)
        except Exception as e:  # noqa: BLE001  (a torn or foreign file: say which and how to fix)
            raise FusionLabError(f"checkpoint {self.ckpt} cannot be read ({e.__class__.__name__}); delete it to "
                                 "start over.") from e
        if state.get("hash") != self.hash:
            raise FusionLabError(f"checkpoint {self.ckpt} belongs to another configuration (hash "
                                 f"{str(state.get('hash'))[:12]} vs this run's {self.hash[:12]}: models, fuser, data or "
                                 "schedule differ); delete it or pass another checkpoint path.")
        self.fuser.load_state_dict(state["fuser"])
        self.opt.load_state_dict(state["opt"])
        self.fuser._noise.set_state(state["noise_rng"])
        self.step, self.tokens, self.rows = state["step"], state["tokens"], state["rows"]
        self.evals, self.best = state.get("evals", []), state.get("best")
        if "torch_rng" in state:  # dropout draws from torch's global generator
            torch.set_rng_state(state["torch_rng"])

    def _done(self, t0: float) -> bool:
        t = self.train
        return ((t.max_tokens is not None and self.tokens >= t.max_tokens)
                or (t.max_seconds is not None and time.perf_counter() - t0 + self._elapsed0 >= t.max_seconds))

    def master_loss(self, i: int) -> float:
        """The master's own loss on chunk i (no slots): what the fused model starts at; computed once."""
        if i not in self._master:
            with torch.no_grad():
                self._master[i] = self._own_loss(self.data[i])
        return self._master[i]

    @torch.no_grad()
    def validate(self) -> dict[str, Any]:
        """Mean loss over the validation chunks now, and the master's own (computed once); a new lowest loss keeps
        the fuser's state as the best."""
        self.fuser.eval()
        noise = self.fuser._noise.get_state()  # the noise control's training stream must not see validation draws
        loss = float(np.mean([float(loss_of(self.fused, self.fuser, p)) for p in self.validation]))
        self.fuser._noise.set_state(noise)
        if not hasattr(self, "_val_master"):
            self._val_master = float(np.mean([self._own_loss(p) for p in self.validation]))
        row = {"step": self.step, "val_loss": loss, "val_master": self._val_master, "val_gain": self._val_master - loss}
        self.evals.append(row)
        if self.best is None or loss < self.best["val_loss"]:
            self.best = {"step": self.step, "val_loss": loss,
                         "state": {k: t.detach().clone() for k, t in self.fuser.state_dict().items()}}
        return row

    def _patience_spent(self) -> bool:
        """`patience` validation passes in a row without a new best."""
        t = self.train
        return t.patience is not None and self.best is not None and \
            sum(1 for e in self.evals if e["step"] > self.best["step"]) >= t.patience

    def _own_loss(self, p: Prepared) -> float:
        pos = torch.arange(p.start, p.start + p.ids.shape[1]).view(1, -1)
        logits = self.fused.master.model(input_ids=p.ids, position_ids=pos, use_cache=False).logits
        return float(F.cross_entropy(logits[0, :-1].float(), p.ids[0, 1:]))

    def _clip(self) -> float:
        return clip_gradients(self.gate_params, self.rest, self.train.clip)

    def run(self, on_step: Callable[[int, float], Any]) -> pd.DataFrame:
        self._resume()
        self._master: dict[int, float] = {}
        self._elapsed0 = self.rows[-1]["seconds"] if self.rows else 0.0
        t0 = time.perf_counter()
        run_f = run_m = None
        n = len(self.data)
        every = self.train.eval_every
        while not self._done(t0):
            if every is not None and self.step % every == 0 and not any(e["step"] == self.step for e in self.evals):
                self.validate()
                if self._patience_spent():
                    self.stopped_early = True
                    break
            self.fuser.train()
            i = int(self._order(self.step // n)[self.step % n])
            p = self.data[i]
            for g in self.opt.param_groups:
                g["lr"] = self._lr() * g["scale"]
            loss = loss_of(self.fused, self.fuser, p)
            value, base = float(loss.detach()), self.master_loss(i)
            run_f = value if run_f is None else 0.9 * run_f + 0.1 * value
            run_m = base if run_m is None else 0.9 * run_m + 0.1 * base
            if not math.isfinite(value) or run_f > self.train.diverge_factor * run_m:
                raise TrainingDiverged(
                    f"training diverged at step {self.step} (loss {value:.4g}; running {run_f:.4g} vs the master's "
                    f"{run_m:.4g}) with learning rate {self._lr():.3g}; the last good checkpoint "
                    f"({self.ckpt or 'none: pass checkpoint='}) is kept. Lower TrainConfig.lr.")
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            norm = self._clip()
            if not math.isfinite(norm):
                raise TrainingDiverged(f"training diverged at step {self.step}: the gradient norm is {norm} with "
                                       f"learning rate {self._lr():.3g}; the last good checkpoint "
                                       f"({self.ckpt or 'none: pass checkpoint='}) is kept. Lower TrainConfig.lr.")
            self.opt.step()
            self.fuser.clamp_gates_()
            self.tokens += int(p.ids.shape[1])
            self.rows.append({"step": self.step, "chunk": i, "tokens": self.tokens, "loss": value,
                              "master_loss": base, "gain": base - value, "lr": self._lr(), "grad_norm": norm,
                              "seconds": self._elapsed0 + time.perf_counter() - t0,
                              "gate_mean": float(np.mean(list(self.fuser.learned_gates().values()))),
                              "key_scale_mean": self.fuser.key_scale_mean()})
            self.step += 1
            on_step(int(p.ids.shape[1]), value)
            if self.step % self.train.checkpoint_every == 0:
                self._save()
        if every is not None and not any(e["step"] == self.step for e in self.evals):
            self.validate()  # the final state is a candidate too
        self._save()
        self.fuser.eval()
        if self.best is not None:  # keep the fuser the validation set preferred (the start, if nothing beat it)
            self.fuser.load_state_dict(self.best["state"])
        return self.history()

    def history(self) -> pd.DataFrame:
        """One row per step (training loss, gain, ...) with the validation columns on the steps they were measured
        at (the state after `step` updates; the final state gets a row of its own)."""
        rows = pd.DataFrame(self.rows)
        if not self.evals:
            return rows
        ev = pd.DataFrame(self.evals)
        return rows.merge(ev, on="step", how="outer").sort_values("step", ignore_index=True) if len(rows) else ev
