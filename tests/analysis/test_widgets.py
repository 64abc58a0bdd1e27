"""The layer-map widget: its logic headless (a plain function), and its ipywidgets driving the map."""
from __future__ import annotations

from fusionlab.analysis.widgets import layer_map_from_controls, layer_map_widget, parse_edits


def test_widget_logic_headless():
    lmap, msg = layer_map_from_controls("stride", 24, 30, step=2)
    assert lmap.pairs == {2 * j: j for j in range(12)} and msg == "12 mapped layers"
    lmap, _ = layer_map_from_controls("proportional", 24, 30, edits="0:5, 23:-")
    assert lmap.pairs[0] == 5 and 23 not in lmap.pairs and lmap.strategy == "proportional + edits"
    lmap, msg = layer_map_from_controls("identity", 24, 30, edits="3:40")
    assert lmap is None and "slave layer 40 is out of range" in msg
    lmap, msg = layer_map_from_controls("identity", 24, 30, edits="3-4")
    assert lmap is None and "master:slave" in msg
    assert parse_edits("1:2; 3:-") == {1: 2, 3: -1}


def test_widget_values_drive_the_layer_map(tiny):
    w = layer_map_widget(tiny("tiny-qwen2"), tiny("tiny-llama"))
    assert w.value.strategy == "proportional"
    w.controls["strategy"].value = "last_aligned"
    assert w.value.pairs == {3: 2, 2: 1, 1: 0}
    w.controls["edits"].value = "0:9"
    assert w.value is None and "out of range" in w.message  # shown in the widget, no exception
    w.controls["edits"].value = "0:0"
    assert w.value.pairs[0] == 0
