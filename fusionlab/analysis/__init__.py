"""Measuring tools: attention capture and its views, the KV-cache budget, next-token loss, intervals, widgets.
Imports the engine (and the foundation) only."""
