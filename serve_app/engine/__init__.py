"""The engine replica: ``ray.serve.llm``'s ``LLMServer`` with its cores, its environment and the direct path.

* :mod:`serve_app.engine.core_binding` and :mod:`serve_app.engine.cpu_cores`: the cores each replica's engine
  runs on.
* :mod:`serve_app.engine.engine_env` and :mod:`serve_app.engine.cluster_env`: the environment of every vLLM
  engine and of every Ray node, one table each.
* :mod:`serve_app.engine.direct_server`: the shipped path, Ray's direct streaming with the ingress's checks
  inside each engine replica.
"""
