"""``python -m load_tests.results``: print ``summary.json``'s JSON schema (docs/summary.schema.json)."""

import sys

from .models import schema_json

sys.stdout.write(schema_json())
