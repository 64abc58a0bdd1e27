"""The lab around the experiments: results on disk, README tables, figures, the notebook runner, the CLI.
May import anything."""
