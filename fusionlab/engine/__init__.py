"""The fusion itself: an LM, its slaves' K/V captured before RoPE, layer maps, projectors, token alignment,
slot placement, the attention function transformers calls, and FusedModel. Imports nothing above it."""
