"""pytest plugin for upstream vLLM's own tests (``python -m testkit.upstream_vllm``): apply the patches first.

vLLM applies ``vllm.general_plugins`` (our patches) when it builds an engine
or its config; upstream's unit tests often build schedulers, connectors and
loggers directly, so without this they would run unpatched. This does what
every vLLM process does, once, before any test module is imported:
``load_general_plugins()``, which honours ``FUZZSERVE_PATCHES_OFF``.

A folder of its own, put on the run's ``PYTHONPATH`` (pytest loads the plugin
by its top-level name, ``-p fuzzserve_upstream``), not a module of a package of
this project: the runs are rooted in upstream's tree, which has its own
``tests`` package.
"""


def pytest_configure(config):
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    import patches

    config.fuzzserve_patches = patches.applied()


def pytest_report_header(config):
    return f"fuzzserve patches applied: {getattr(config, 'fuzzserve_patches', None)}"
