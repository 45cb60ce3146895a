"""The load tests' typed errors: library code raises these, only the CLI turns them into exit codes.

* :class:`SetupError`: the run cannot start as asked (a scenario that needs a
  local cluster pointed at ``--url``, a cluster that placed every replica on
  one node, ...): the CLI exits 2 (``EXIT_USAGE``) with the message.
* :class:`StepError`: one operation step cannot be carried out (a node that
  is not a worker, an autoscale step without a load level); the operator
  records it as an ``operation_failed`` event and the verdict fails the run
  with its message, so the run still ends with a report.
"""

from __future__ import annotations


class LoadTestError(Exception):
    """Base of the load tests' own errors."""


class SetupError(LoadTestError):
    """The run cannot start as asked (a usage or set-up error: exit code 2)."""


class StepError(LoadTestError):
    """An operation step cannot be carried out (recorded as an ``operation_failed`` event; the run goes on to its
    report and fails)."""
