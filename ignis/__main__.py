"""`python -m ignis` runs the ignis command line."""
import sys

from .api.cli import main

sys.exit(main())
