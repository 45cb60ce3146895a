"""``python -m load_tests``: the stress-test CLI (see load_tests/cli.py)."""

import sys

from .cli import main

sys.exit(main())
