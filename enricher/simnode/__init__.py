"""A SIMULATED GPU node, for the demo, the tests and the benchmark.

Everything here stands in for something a machine without a GPU or a cluster lacks, and says
so: :mod:`.node` describes the node (its GPUs, MIG devices, GPU processes and pods),
:mod:`.gpus` is a moving stand-in for NVML (its load, power and energy on one clock),
:mod:`.exporter` is its dcgm-exporter, :mod:`.fakeproc` writes the node's /proc tree,
:mod:`.kubelet` serves its PodResources allocations over real gRPC, and :mod:`.api` builds the
API objects the API server would hold for it (pods, ResourceSlices) and a static pod source.
The serving path never imports this package (tests/test_structure.py holds it to that).
"""
