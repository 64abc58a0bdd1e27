"""Layer-mapping widget. Its logic is `layer_map_from_controls`, a plain function tested headless; the
widget only wires ipywidgets to it and draws the map as a master-layer x slave-layer grid."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import FusionLabError
from ..engine.layermap import LayerMap


def parse_edits(text: str) -> dict[int, int]:
    """'3:5, 7:-' -> {3: 5, 7: -1} (-1 or '-' removes master layer 7 from the map)."""
    edits: dict[int, int] = {}
    for part in filter(None, (p.strip() for p in text.replace(";", ",").split(","))):
        if ":" not in part:
            raise FusionLabError(f"edit {part!r} should look like 'master:slave' (e.g. '3:5', or '3:-' to remove).")
        i, j = (x.strip() for x in part.split(":", 1))
        try:
            edits[int(i)] = -1 if j in ("-", "") else int(j)
        except ValueError:
            raise FusionLabError(f"edit {part!r}: layer numbers must be integers.") from None
    return edits


def layer_map_from_controls(strategy: str, master_layers: int, slave_layers: int, step: int = 2,
                            edits: str | dict[int, int] = "") -> tuple[LayerMap | None, str]:
    """(LayerMap, message): the chosen strategy with single entries edited; on bad input (None, why)."""
    try:
        lmap = LayerMap.build(strategy, master_layers, slave_layers, **({"step": step} if strategy == "stride" else {}))
        changes = parse_edits(edits) if isinstance(edits, str) else dict(edits)
        pairs = dict(lmap.pairs)
        for i, j in changes.items():
            if j < 0:
                pairs.pop(i, None)
            else:
                pairs[i] = j
        strategy_name = lmap.strategy + (" + edits" if changes else "")
        out = LayerMap(pairs, strategy_name, master_layers, slave_layers, lmap.params)
    except FusionLabError as e:
        return None, str(e)
    return out, f"{len(out)} mapped layers"


@dataclass
class LayerMapWidget:
    """`w = layer_map_widget(master, slave); display(w.box)`; then `w.value` is the LayerMap."""

    box: Any
    value: LayerMap | None
    message: str
    controls: dict[str, Any]
    """'strategy', 'step', 'edits': the ipywidgets, for scripting and tests."""


def layer_map_widget(master: Any, slave: Any, strategy: str = "proportional") -> LayerMapWidget:
    import ipywidgets as W
    import matplotlib.pyplot as plt

    lm, ls = master.spec.layers, slave.spec.layers
    strat = W.Dropdown(options=list(LayerMap.STRATEGIES), value=strategy, description="strategy")
    step = W.BoundedIntText(value=2, min=1, max=max(lm, 1), description="stride step")
    edits = W.Text(value="", placeholder="e.g. 3:5, 7:-", description="edit")
    msg, plot = W.HTML(), W.Output()
    state = LayerMapWidget(W.VBox([W.HBox([strat, step]), edits, msg, plot]), None, "",
                           {"strategy": strat, "step": step, "edits": edits})

    def redraw(*_: Any) -> None:
        state.value, state.message = layer_map_from_controls(strat.value, lm, ls, step.value, edits.value)
        colour = "#1a7f37" if state.value is not None else "#cf222e"
        msg.value = f"<span style='color:{colour}'>{state.message}</span>"
        plot.clear_output(wait=True)
        if state.value is not None:
            with plot:
                fig, ax = plt.subplots(figsize=(4, 3))
                ax.imshow(state.value.grid().values, cmap="Blues", aspect="auto", origin="lower")
                ax.set_xlabel(f"slave layer ({slave.name})")
                ax.set_ylabel(f"master layer ({master.name})")
                plt.show()

    for w in (strat, step, edits):
        w.observe(redraw, names="value")
    redraw()
    return state
