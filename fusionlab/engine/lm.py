"""`fl.LM`: a loaded causal LM with its tokenizer, name, spec and a fingerprint for provenance."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch

from .spec import ModelSpec, spec_from_config


@dataclass(eq=False)
class LM:
    """A model ready for FusionLab. `fingerprint` ties projectors and results to exact weights."""

    model: Any
    """The transformers causal LM (eval mode)."""
    tokenizer: Any
    """Its fast tokenizer (offsets are needed for cross-tokenizer alignment)."""
    name: str
    source: str = "hf"
    """'embedded', 'tiny' or 'hf' (hub id / local path)."""
    source_sha256: str | None = None
    """sha256 of the file the weights came from (the assembled GGUF for embedded models)."""
    extra: dict[str, Any] = field(default_factory=dict)
    _rebuild: dict[str, Any] | None = field(default=None, repr=False)
    _state_at_rebuild: int | None = field(default=None, repr=False)

    def remember_rebuild(self, how: dict[str, Any]) -> None:
        """Record how to make this exact LM again (`fusionlab.models.rebuild`), as it is now. A Ray worker then
        loads it itself instead of receiving its weights; any later change to the weights or config voids it."""
        self._rebuild, self._state_at_rebuild = how, self._state()

    def rebuild_recipe(self) -> dict[str, Any] | None:
        """The recorded recipe while the model is untouched since it was recorded, else None (send it by value)."""
        state = self._state()
        return self._rebuild if self._rebuild is not None and state is not None and state == self._state_at_rebuild else None

    def _state(self) -> int | None:
        """Cheap token of the model's current state: each tensor's storage, shape and in-place version counter,
        and the config. Any in-place edit (add_, copy_), replaced tensor or config change alters it. None when a
        tensor was made under torch.inference_mode (those keep no version counter, so an edit could not be seen):
        such a model is never rebuilt from its recipe, it travels by value."""
        tensors = [*self.model.named_parameters(), *self.model.named_buffers()]
        if any(t.is_inference() for _, t in tensors):
            return None
        return hash((tuple((n, t.data_ptr(), tuple(t.shape), t._version) for n, t in tensors),
                     self.model.config.to_json_string()))

    @cached_property
    def spec(self) -> ModelSpec:
        return spec_from_config(self.model.config, has_chat_template=bool(getattr(self.tokenizer, "chat_template", None)))

    @property
    def device(self) -> torch.device:
        """Where inputs go: the parameters' device, or, when accelerate's hooks hold the weights (offloading leaves the
        parameters on 'meta'), the hooks' execution device."""
        device = next(self.model.parameters()).device
        if device.type != "meta":
            return device
        for module in self.model.modules():
            ex = getattr(getattr(module, "_hf_hook", None), "execution_device", None)
            if ex is not None:
                return torch.device("cuda", ex) if isinstance(ex, int) else torch.device(ex)
        return device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @cached_property
    def fingerprint(self) -> str:
        """Source sha when known; else a hash over parameter names, shapes and values (exact weights)."""
        if self.source_sha256:
            return self.source_sha256
        h = hashlib.sha256(self.name.encode())
        for pname, p in sorted(self.model.state_dict().items()):
            h.update(pname.encode())
            h.update(str(tuple(p.shape)).encode())
            h.update(p.detach().float().cpu().numpy().tobytes())
        h.update(repr(self.model.config.to_dict().get("rope_parameters")).encode())
        return h.hexdigest()

    @cached_property
    def vocab_hash(self) -> str:
        """Identical tokenizers have identical vocab hashes (token -> id, special tokens)."""
        items = sorted(self.tokenizer.get_vocab().items())
        specials = [self.tokenizer.bos_token_id, self.tokenizer.eos_token_id, self.tokenizer.pad_token_id]
        return hashlib.sha256(repr((items, specials)).encode()).hexdigest()

    def chat_prompt(self, text: str) -> str:
        """`text` wrapped in the model's chat template (as a user turn), or unchanged for base models."""
        if not self.spec.has_chat_template:
            return text
        return self.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                  add_generation_prompt=True)

    def encode(self, text: str, special_tokens: bool = True) -> torch.Tensor:
        """Token ids (1, T) on the model's device; special tokens (a BOS) as the tokenizer adds them, unless the text
        continues a sequence (`special_tokens=False`)."""
        ids = self.tokenizer(text, return_tensors="pt", add_special_tokens=special_tokens)["input_ids"]
        return ids.to(self.device)

    def __repr__(self) -> str:
        s = self.spec
        return (f"LM({self.name!r}, {s.model_type}, layers={s.layers}, heads={s.heads}/{s.kv_heads}kv, "
                f"head_dim={s.head_dim}, dtype={self.dtype}, device={self.device})")
