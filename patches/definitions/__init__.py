"""What the patches define that the rest of the project reads too (no vLLM import needed for any of it).

- :mod:`patches.definitions.fuzz_params`: the request's fuzz keys in ``vllm_xargs`` and their one parser (the
  guard, the router and vLLM's frontend all call it);
- :mod:`patches.definitions.fuzz_math`: the noise, as a pure function of (seed, position), shared by the fuzz
  patches and the matrix's independent reference;
- :mod:`patches.definitions.metrics`: the names and label values of the metrics the patches export;
- :mod:`patches.definitions.fault_config`: the KV fault injection's configuration (``kv_faults``).
"""
