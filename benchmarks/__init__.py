"""Benchmarks a user runs to judge the project: ``vs_vllm`` (the head-to-head with plain vLLM and stock
``ray.serve.llm``), ``bench_agreement`` and ``knee_agreement`` (our figures against the field's tools and the
server's own count), ``serve_stack``, ``routing_hits`` and ``patch_overhead`` (what each layer, routing policy and
patch costs). Their shared machinery is :mod:`benchmarks.harness`; the one-question studies still open are
:mod:`benchmarks.investigations` (those answered are retired to docs/results_log.md). ``benchmarks/README.md`` lists
each with its purpose."""
