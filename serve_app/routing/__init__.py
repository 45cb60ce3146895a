"""Which engine replica serves a request: the one holding the KV its (fuzz setting, prompt prefix) can reuse.

* :mod:`serve_app.routing.keys`: the keys and the hash, without Ray.
* :mod:`serve_app.routing.fuzz_router`: the fuzz-aware request router (Serve's ``RequestRouter``).
* :mod:`serve_app.routing.ingress_router`: the direct path's ingress request router, fed a bounded view of
  the body.
* :mod:`serve_app.routing.routers`: the routers an app can pick by name (``routing:`` in the YAML).
"""
