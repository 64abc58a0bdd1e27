"""`python -m fusionlab ...` is the `fusionlab` command."""
import sys

from .lab.cli import main

sys.exit(main())
