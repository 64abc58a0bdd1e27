"""Everything `fuse()` installs, in one registry: the only global state FusionLab keeps.

transformers calls an attention function with the attention *module* and nothing that names the fusion, so the
function looks the module up here to find its layer's runtime (slots, gates, recorder). Entries are keyed by the
objects themselves, in WeakKeyDictionaries (never by `id()`, which a new object may reuse), and are written only by
`install()` (called by `fuse()`) and `remove()` (called by `FusedModel.close()`): closing a fusion leaves nothing
behind, and the master's own attention implementation is restored by the same call.

Also registered once per process, by name, with transformers' AttentionInterface and AttentionMaskInterface: the
attention functions `fusionlab_<base>` (one per base backend, see `attention.install_interface`). They hold no
state, and a model that does not select them never calls them.
"""
from __future__ import annotations

from typing import Any
from weakref import WeakKeyDictionary

from .attention_core import LayerRuntime

RUNTIMES: "WeakKeyDictionary[Any, LayerRuntime]" = WeakKeyDictionary()
"""Attention module of a fused master -> that layer's LayerRuntime."""
FUSIONS: "WeakKeyDictionary[Any, Any]" = WeakKeyDictionary()
"""Fused master model (the transformers module) -> the `fuse.FusedModel` installed on it (typed Any: the registry
sits below `fuse.py`, which writes it, so it cannot name that class without an import circle)."""


def install(model: Any, runtimes: dict[Any, LayerRuntime], fusion: Any) -> None:
    """Record a fusion: its model and every attention module's runtime."""
    FUSIONS[model] = fusion
    for module, rt in runtimes.items():
        RUNTIMES[module] = rt


def remove(model: Any, modules: list[Any]) -> None:
    """Forget a fusion (idempotent)."""
    FUSIONS.pop(model, None)
    for module in modules:
        RUNTIMES.pop(module, None)


def runtime(module: Any) -> LayerRuntime | None:
    return RUNTIMES.get(module)


def fusion_on(model: Any) -> Any:
    """The FusedModel installed on this transformers model, if any."""
    return FUSIONS.get(model)
