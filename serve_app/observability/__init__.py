"""What a deployment exports for its operators and its load tests.

* :mod:`serve_app.observability.contract`: the metric names, the invariants over them, and the load tests'
  check and Prometheus alert each becomes.
* :mod:`serve_app.observability.fuzz_traffic`: the counter of the requests the guard admitted, by fuzz mode and
  strength.
"""
