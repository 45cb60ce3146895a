"""What stands between a client and vLLM's OpenAI app: the edge, the guard and its policies, the probes.

* :mod:`serve_app.ingress.edge`, :mod:`serve_app.ingress.listener_bounds` and ``haproxy_edge.sh``: the
  outermost layer of every listener Serve opens (headers Ray would obey, a request head's time and size).
* :mod:`serve_app.ingress.guard`: the guard, one ASGI middleware outermost on whichever app answers HTTP;
  :mod:`serve_app.ingress.route_policy` (which routes exist) and :mod:`serve_app.ingress.xargs_policy`
  (what a client may set, and how a refusal reads).
* :mod:`serve_app.ingress.probes`: ``/ready`` and ``/health``.

Which app answers is elsewhere: the shipped direct path's server is :mod:`serve_app.engine.direct_server` (in
each engine replica), the ``ingress: router`` path's HTTP deployment :mod:`serve_app.router_path`.
"""
