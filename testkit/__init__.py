"""Helpers shared by the tests and the benchmarks (packaged, so that ``benchmarks`` never imports ``tests``).

| module | what |
|--------|------|
| ``testkit.engine_host`` | a real vLLM engine (offline ``LLM``) in a child process, killed by process group |
| ``testkit.server_process`` | a server as a child process group: started, waited for, killed by id |
| ``testkit.engine_requests`` | the fuzz tests' prompts and sampling/fuzz parameter builders |
| ``testkit.accounting_workload`` | the accounting/offloading engine tests' workload, engine settings and checks |
| ``testkit.serve`` | what the tests' Ray Serve cluster is deployed with |

Tests import these (and the fixtures of ``tests/conftest.py``), never another test module.
"""
