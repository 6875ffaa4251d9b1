"""The stand-ins and helpers the tests and the bench share, written once (docs/development.md).

Not shipped: the wheel holds ``enricher`` only (pyproject.toml's packages.find). The tests and
the bench import it from the checkout; it imports neither of them.

- ``nvmlfake``: the fake ``libnvidia-ml.so.1`` built from C (``fakenvml/``), its state file
  and the pytest fixtures over it; ``nvml_state_of`` writes a simulated node's GPUs into it.
- ``kubeapi``: the API-server stand-in (pod list and watch, ResourceSlices).
- ``upstream``: dcgm-exporter stand-ins (an aiohttp server that plays failures, a threaded
  text server for processes outside the test's event loop).
- ``prometheus``: a Prometheus started on a config, and its HTTP API.
- ``dashboard``: the shipped dashboard's queries and the shipped rules' records.
- ``fieldquery``: PromQL that reads a field of dcgm-exporter by meaning, in its SI unit,
  under every name the field table gives it (the dashboards' source and the recipes read
  fields through it too).
- ``promtool``: PromQL and the shipped rules over a scraped text (``promtool test rules``).
- ``ports``, ``processes``, ``clocks``, ``http``, ``tools``: free ports, servers started as
  commands and stopped, a settable clock, an HTTP GET, the external tools and the
  repository's scripts.
"""
