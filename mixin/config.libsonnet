{
  _config+:: {
    // Selects the enricher's scrape targets (GpuEnricherDown, GpuEnricherAbsent). Every
    // ServiceMonitor, PodMonitor and scrape config of this project sets job="dcgm-enricher".
    enricherSelector: 'job="dcgm-enricher"',

    // Added to every series the rules and the dashboard read from what the enricher serves:
    // dcgm-exporter's fields as the enricher rewrites them (under every name the field table,
    // lib/dcgm_fields.json, knows), and its gpu_*, dcgm_enricher_* and process_* series. Empty:
    // every job. Set it (to job="dcgm-enricher", say) where Prometheus also scrapes
    // dcgm-exporter itself, so that its unattributed copy of the fields stays out.
    dcgmSelector: '',

    // The label that tells clusters apart where the series carry one (external labels,
    // Thanos, Mimir): every aggregation keeps it, the dashboard filters on it.
    clusterLabel: 'cluster',

    // The label that names the node on every series the rules and the dashboard read. The
    // enricher writes `node` (its Kubernetes node name, or the host's name) on every series it
    // serves, whatever dcgm-exporter calls its own (`Hostname` up to 4.8.2, `hostname` from
    // 4.8.3) and whatever value that holds (docs/labels.md). Change it only where Prometheus
    // renames the enricher's label (metric relabelings).
    nodeLabel: 'node',

    // The label of gpu_pod_info that names the JupyterHub user: the enricher writes each pod
    // annotation named in --kube.pod-annotations as annotation_<name> (sanitised), and
    // hub.jupyter.org/username, kubespawner's, is in its default list. Change it where your
    // hub writes the user elsewhere (a pod label: label_<name>).
    userLabel: 'annotation_hub_jupyter_org_username',

    // Below this SM utilization (a ratio) an allocated or memory-holding GPU counts as idle
    // (GpuAllocatedIdle, GpuMemoryHeldWhileIdle, the dashboard's waste panels).
    idleUtilizationThreshold: 0.01,
    // GpuMemoryHeldWhileIdle: memory a container holds on an idle GPU, in bytes.
    idleMemoryBytes: 1073741824,
    // GpuHeldIdle: seconds a container holds GPUs without using any of them (the enricher's
    // --idle.threshold says what counts as use) before it fires; 3600 is JupyterHub's
    // idle-culler default timeout.
    heldIdleSeconds: 3600,
    // GpuMemoryNearlyFull: the share of a GPU's (or MIG instance's) memory in use.
    memoryNearlyFullRatio: 0.95,
    // GpuPodMemoryGrowing: how far above its day's mean a container must be, in bytes.
    memoryGrowthMinBytes: 1073741824,
    // GpuTemperatureHigh, in degrees Celsius.
    temperatureCelsius: 85,
    // GpuEnricherMemoryNearLimit: the enricher's resident memory over its limit.
    enricherMemoryLimitRatio: 0.9,

    // Where each alert's runbook is: `%s` is the alert's anchor in docs/runbook.md (its name
    // in lower case), as in 'https://<host>/<path>/docs/runbook.md#%s' (docs/alerts.md).
    // Empty: no runbook_url (every description names its docs/runbook.md section).
    runbookURLPattern: '',

    // The dashboards (docs/dashboard.md), each with its uid and title; their links to one
    // another name the uids. The Cluster dashboard keeps the uid of the one dashboard it
    // replaced, so bookmarks of it land on the fleet's view.
    clusterDashboardUid: 'dcgm-enricher-gpu',
    clusterDashboardTitle: 'GPU / Cluster',
    namespaceDashboardUid: 'dcgm-enricher-namespace',
    namespaceDashboardTitle: 'GPU / Namespace (Pods)',
    podDashboardUid: 'dcgm-enricher-pod',
    podDashboardTitle: 'GPU / Pod',
    nodeDashboardUid: 'dcgm-enricher-node',
    nodeDashboardTitle: 'GPU / Node',
    enricherDashboardUid: 'dcgm-enricher-self',
    enricherDashboardTitle: 'GPU / Enricher',
    dashboardRefresh: '30s',

    // Percentages for the annotations, from the ratios above.
    idleUtilizationPercent: '%g' % (self.idleUtilizationThreshold * 100),
    memoryNearlyFullPercent: '%g' % (self.memoryNearlyFullRatio * 100),
    // And the idle memory, in GiB, for the dashboard's descriptions.
    idleMemoryGiB: '%g' % (self.idleMemoryBytes / 1073741824),
  },
}
