"""What the benchmarks share: the arms they compare (plain vLLM, stock ``ray.serve.llm``, the shipped stack), the
Serve targets, the prompts, the clients (vLLM's ``bench serve``, GuideLLM), the host's CPU and the server's own
counters, and the paired statistics."""
