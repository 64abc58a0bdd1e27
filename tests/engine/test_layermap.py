"""Layer-map strategies (exact values), validation and round trips."""
from __future__ import annotations

import pytest

from fusionlab import LayerMap
from fusionlab.errors import FusionLabError


def test_strategies_exact():
    assert LayerMap.identity(4, 3).pairs == {0: 0, 1: 1, 2: 2}
    assert LayerMap.stride(8, 5, step=2).pairs == {0: 0, 2: 1, 4: 2, 6: 3}
    assert LayerMap.proportional(24, 30).pairs[23] == 29 and len(LayerMap.proportional(24, 30)) == 24
    assert LayerMap.proportional(24, 18).pairs == {round((j + .5) * 24 / 18 - .5): j for j in range(18)}
    assert LayerMap.last_aligned(24, 18).pairs == {23 - k: 17 - k for k in range(18)}
    interp = LayerMap.interpolate(24, 18)
    assert len(interp) == 24 and interp.pairs[0] == 0 and interp.pairs[23] == 17


def test_validation_and_roundtrip():
    with pytest.raises(FusionLabError, match="master layer 5 is out of range"):
        LayerMap({5: 0}, master_layers=4, slave_layers=4)
    with pytest.raises(FusionLabError, match="stride step must be >= 1"):
        LayerMap.stride(4, 4, step=0)
    interp = LayerMap.interpolate(6, 3)
    with pytest.raises(FusionLabError, match="slave layer 0 feeds master layers"):
        interp.require_unique_slave_layers("replace mode")
    lm = LayerMap.proportional(24, 30)
    assert LayerMap.from_dict(lm.to_dict()).pairs == lm.pairs
    assert lm.grid().values.sum() == 24
    assert "<b>LayerMap</b>" in lm._repr_html_()
