"""Running a load: the loop that drives a scenario at a target beside the monitor, its probes, kill and operations
(``loop``), the capacity search's driver (``sweep``), and :func:`~load_tests.runner.run.run`, a whole run as one
library call (deploy, load, judge, report)."""
