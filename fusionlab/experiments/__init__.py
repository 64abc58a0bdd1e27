"""Each notebook's logic: harnesses, settings, and the verdict rules of its claims (tested on hand-made data).
Imports engine, models and analysis; never lab."""
