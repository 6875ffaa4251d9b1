"""The one frozen configuration object that cli.py builds from flags and environment."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Config:
    listen_address: str = ":9401"
    upstream_url: str = "http://127.0.0.1:9400/metrics"
    upstream_timeout: float = 5.0
    upstream_max_bytes: int = 32 * 1024 * 1024
    # Label names dcgm-exporter copies from the pods it names (its pod-label allowlist, as
    # they appear on its series): dropped from a series that the enricher moves to another pod
    # even when the pod watch does not know the pod dcgm-exporter named.
    upstream_pod_labels: tuple[str, ...] = ()
    upstream_discover_pod: bool = False
    upstream_pod_selector: str = "app=nvidia-dcgm-exporter"
    upstream_pod_namespace: str = "gpu-operator"
    web_config_file: str | None = None
    procfs: str = "/proc"
    nvml_library: str | None = None
    nvml_enabled: bool = True
    kube_enabled: bool | None = None  # None: on when a node name is known
    kube_node_name: str = ""
    # The host's name (cli.py: socket.gethostname()), the node label's value where no
    # Kubernetes node name is known (Docker and bare-metal modes).
    host_name: str = ""
    kube_kubeconfig: str | None = None
    kube_pod_labels: tuple[str, ...] = ()
    kube_pod_annotations: tuple[str, ...] = ("hub.jupyter.org/username",)
    # The pods that may run the MPS control daemon and server (podparse.parse_mps_daemon_pods):
    # NVIDIA's device plugin's MPS control daemon as the GPU Operator deploys it (label app=...,
    # namespace gpu-operator) and as the plugin's Helm chart does (app.kubernetes.io/name=...,
    # namespace nvidia-device-plugin).
    mps_daemon_pod_selector: str = (
        "app=nvidia-device-plugin-mps-control-daemon;app.kubernetes.io/name=nvidia-device-plugin"
    )
    mps_daemon_pod_namespace: tuple[str, ...] = ("gpu-operator", "nvidia-device-plugin")
    kubelet_pod_resources_socket: str = "/var/lib/kubelet/pod-resources/kubelet.sock"
    kubelet_enabled: bool | None = None  # None: on when Kubernetes is on
    kubelet_timeout: float = 2.0
    kubelet_gpu_resources: tuple[str, ...] = ()  # besides nvidia.com/gpu, .shared, mig-*
    kubelet_dra_drivers: tuple[str, ...] = ()  # besides gpu.nvidia.com
    # List the node's ResourceSlices to map DRA devices to GPUs (with Kubernetes on).
    kube_resource_slices: bool = True
    # Docker mode (only without Kubernetes): "" is cgroup-only mode, containers by short ID.
    docker_host: str = "unix:///var/run/docker.sock"
    docker_timeout: float = 2.0
    collector_process: bool = False
    # SM utilization (a ratio) above which a container counts as active on a device
    # (gpu_container_last_active_timestamp_seconds).
    idle_threshold: float = 0.01
    scrape_timeout: float = 10.0
    # > 0: NVML, procfs and the kubelet are read in the background every that many seconds;
    # 0: right after each upstream collection when following it, else on every scrape.
    collect_interval: float = 0.0
    # > 0: the upstream is fetched right after each of its collections, found by polling every
    # that many seconds around the time it is due; 0: fetched on every scrape.
    upstream_follow_step: float = 0.1
    # --bridge.naming: serve dcgm-exporter's fields in this naming of the field table (4.8,
    # 4.9, 4.10), whatever the exporter's release (enricher.bridge); None: as they came.
    bridge_naming: str | None = None
    log_level: str = "info"
    # Set by the demo only: shown on the landing page.
    simulated: bool = False

    @property
    def kube_active(self) -> bool:
        if self.kube_enabled is None:
            return bool(self.kube_node_name)
        return self.kube_enabled

    @property
    def node(self) -> str:
        """The ``node`` label's value on every series the enricher serves: the Kubernetes
        node's name, else the host's; empty (no label) when neither is known."""
        return self.kube_node_name or self.host_name

    @property
    def kubelet_active(self) -> bool:
        """Whether the kubelet PodResources source runs. Once on, a socket that is missing is
        the source down, not off: only ``--no-kubelet.enabled`` (or an empty socket path)
        switches it off. By default on wherever Kubernetes is, so a plain Docker host does not
        report a kubelet it never had."""
        if not self.kubelet_pod_resources_socket:
            return False
        if self.kubelet_enabled is None:
            return self.kube_active
        return self.kubelet_enabled

    @property
    def docker_active(self) -> bool:
        """Whether GPU processes in containers are named after Docker containers: on a host
        without Kubernetes (with the API, or from the cgroup alone when ``docker_host`` is "")."""
        return not self.kube_active
