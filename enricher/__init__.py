"""dcgm-enricher: attribute GPU use to the real Kubernetes workload, beside dcgm-exporter."""

__version__ = "0.1.0"
