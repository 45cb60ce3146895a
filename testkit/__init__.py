"""The rigs that exist to test and to measure: shared by the tests and the benchmarks, imported by no shipped package.

The shipped packages (``patches``, ``serve_app``, ``load_tests``,
``monitoring``, ``fixture_model``) never import this one, nor ``tests`` or
``benchmarks`` (``tests/test_layout.py`` keeps it so); it is a package so that
``benchmarks`` never imports ``tests``.

| module | what |
|--------|------|
| ``testkit.engine_host`` | a real vLLM engine (offline ``LLM``) in a child process, killed by process group |
| ``testkit.server_process`` | a server as a child process group: started, waited for, killed by id |
| ``testkit.engine_requests`` | the fuzz tests' prompts and sampling/fuzz parameter builders |
| ``testkit.accounting_workload`` | the accounting/offloading engine tests' workload, engine settings and checks |
| ``testkit.serve`` | what the tests' Ray Serve cluster is deployed with |
| ``testkit.echo_server`` | an OpenAI-compatible streaming server with ``/metrics`` and fault switches: the load  |
|                         | tests' known peer (``python -m testkit.echo_server``)                                 |
| ``testkit.upstream_vllm`` | upstream vLLM's own tests, patches on and off, compared (``python -m               |
|                           | testkit.upstream_vllm``; its pytest plugin in ``upstream_plugin/``)                  |
| ``testkit.monitoring`` | the monitoring files' checks (promtool, Grafana's schema), the fixtures they run on, |
|                        | the end-to-end run with a real Prometheus                                           |

Tests import these (and the fixtures of ``tests/conftest.py``), never another test module.
"""
