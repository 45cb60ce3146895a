"""Judging a run: its figures, whether each planned fault fired and was handled, who died unplanned, and the
verdict, which owns every reason a run fails.

Pure functions over the requests' results, the monitor's findings and the
run's events; no I/O.
"""
