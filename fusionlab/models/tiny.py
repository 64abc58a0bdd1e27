"""Tiny random models with a small local tokenizer: the unit tests' models, built in a second, offline.

Their geometries differ on purpose (head_dim, KV heads, layer count, RoPE θ, sliding layers, fused qkv),
and two tokenizers exist (plain bytes, and bytes with a few merges) so cross-tokenizer paths get exercised.
Weights use a larger init than usual so attention is far from uniform and exactness tests can fail;
norm weights are perturbed (seeded) so norm differences between models are real.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import (
    AutoModelForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    Phi3Config,
    PretrainedConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

SPECIALS = ["<pad>", "<s>", "</s>"]
MERGES = [("t", "h"), ("h", "e"), ("i", "n"), ("a", "n"), ("e", "r"), ("o", "n"), ("Ġ", "t"), ("th", "e"), ("Ġt", "he")]
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant: {% endif %}"
)
SEED = 0


def tiny_tokenizer(merged: bool = False) -> PreTrainedTokenizerFast:
    """Byte-level BPE over the 256 byte symbols (+ a few merges when `merged`), with offsets."""
    vocab = {s: i for i, s in enumerate(SPECIALS)}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    merges = MERGES if merged else []
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _common(vocab: int) -> dict[str, Any]:
    return dict(vocab_size=vocab, max_position_embeddings=512, initializer_range=0.25, pad_token_id=0,
                bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)


def _qwen2(vocab: int) -> PretrainedConfig:
    return Qwen2Config(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=16, intermediate_size=128, rope_parameters={"rope_type": "default",
                       "rope_theta": 1e6}, **_common(vocab))


def _llama(vocab: int) -> PretrainedConfig:
    return LlamaConfig(hidden_size=48, num_hidden_layers=3, num_attention_heads=3, num_key_value_heads=1,
                       head_dim=16, intermediate_size=96, rope_parameters={"rope_type": "default",
                       "rope_theta": 1e5}, **_common(vocab))


def _phi3(vocab: int) -> PretrainedConfig:
    return Phi3Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                      intermediate_size=128, rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                      "partial_rotary_factor": 1.0}, **_common(vocab))


def _gemma3(vocab: int) -> PretrainedConfig:
    return Gemma3TextConfig(hidden_size=64, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1,
                            head_dim=32, intermediate_size=128, query_pre_attn_scalar=32, sliding_window=8,
                            layer_types=["sliding_attention"] * 3 + ["full_attention"],
                            rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                                             "full_attention": {"rope_type": "default", "rope_theta": 1e6}},
                            **_common(vocab))


# name -> (config builder, tokenizer with merges?)
TINY: dict[str, tuple[Callable[[int], PretrainedConfig], bool]] = {
    "tiny-qwen2": (_qwen2, False),
    "tiny-llama": (_llama, True),
    "tiny-phi3": (_phi3, False),
    "tiny-gemma3": (_gemma3, True),
}


def tiny_config(name: str) -> PretrainedConfig:
    build, merged = TINY[name]
    return build(len(tiny_tokenizer(merged)))


def build_tiny(name: str, dtype: torch.dtype, attn_implementation: str,
               config: PretrainedConfig | None = None) -> tuple[torch.nn.Module, PreTrainedTokenizerFast]:
    """Random-init model (seed fixed per name) and its tokenizer. `config` overrides (e.g. a θ-shifted copy)."""
    _, merged = TINY[name]
    tokenizer = tiny_tokenizer(merged)
    config = config or tiny_config(name)
    config._attn_implementation = attn_implementation
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(SEED)
    try:
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        with torch.no_grad():  # trained models' norms are far from their init; make ours differ too
            for pname, p in model.named_parameters():
                if "norm" in pname:
                    p.add_(0.2 * torch.randn_like(p))
    finally:
        torch.random.set_rng_state(gen_state)
    model.eval()
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer
