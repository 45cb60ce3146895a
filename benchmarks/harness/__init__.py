"""What the benchmarks share: the arms they compare (plain vLLM, stock ``ray.serve.llm``, the shipped stack), the
Serve targets, the prompts, the clients (vLLM's ``bench serve``, GuideLLM, ours in-process), the host's CPU and the
server's own counters, and the paired statistics; and the headline's own parts (``benchmarks.vs_vllm`` is their
command): its workload, a phase and its client, the run record and void rule, the figures, the report."""
