local fields = import '../lib/fields.libsonnet';
local utils = import '../lib/utils.libsonnet';
local oneLine = utils.oneLine;

// The XID codes that need action on the node (drain, GPU reset, reboot or RMA): 48 double-bit
// ECC, 61/62 micro-controller breakpoint/halt, 63/64 row-remapping event/failure, 74 NVLink,
// 79 fallen off the bus, 92 high single-bit ECC rate, 95 uncontained ECC, 119/120 GSP,
// 140 unrecovered ECC. GpuXidCriticalError fires on them, GpuXidError on the others.
local criticalXids = [48, 61, 62, 63, 64, 74, 79, 92, 95, 119, 120, 140];

{
  prometheusAlerts+:: {
    groups+: utils.groups([
      {
        name: 'dcgm-enricher.waste',
        rules: [
          {
            // Allocated devices of a container with no process on them, or with processes below
            // idleUtilizationThreshold (the record, mixin/rules: the dashboard reads it too).
            alert: 'GpuAllocatedIdle',
            expr: |||
              count by (%(clusterLabel)s, %(nodeLabel)s, namespace, pod, container) (
                namespace_pod_container_device:gpu_allocated_idle:max
              )
            ||| % $._config,
            'for': '2h',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'Allocated GPUs have been idle for 2 hours.',
              description: oneLine(|||
                Container {{ $labels.container }} of pod {{ $labels.namespace }}/{{ $labels.pod }} on
                {{ $labels.%(nodeLabel)s }} holds {{ $value }} allocated GPU device(s) with no process or
                under %(idleUtilizationPercent)s%% utilization. Ask the owner to release them (scale
                down, stop the notebook, delete the finished job). Runbook:
                docs/runbook.md#gpuallocatedidle.
              ||| % $._config),
            },
          },
          {
            alert: 'GpuMemoryHeldWhileIdle',
            expr: |||
              sum by (%(clusterLabel)s, %(nodeLabel)s, gpu, UUID, GPU_I_ID, namespace, pod, container) (
                gpu_container_memory_used_bytes{%(dcgmSelector)s}
              ) > %(idleMemoryBytes)d
              and on (%(clusterLabel)s, %(nodeLabel)s, gpu, UUID, GPU_I_ID, namespace, pod, container)
              max by (%(clusterLabel)s, %(nodeLabel)s, gpu, UUID, GPU_I_ID, namespace, pod, container) (
                gpu_container_utilization_ratio{%(dcgmSelector)s}
              ) < %(idleUtilizationThreshold)g
            ||| % $._config,
            'for': '1h',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'A container holds GPU memory without using the GPU.',
              description: oneLine(|||
                Container {{ $labels.container }} of pod {{ $labels.namespace }}/{{ $labels.pod }} has
                held {{ $value | humanize1024 }}B on GPU {{ $labels.gpu }} of {{ $labels.%(nodeLabel)s }} at
                under %(idleUtilizationPercent)s%% utilization for an hour: typically a finished job or
                notebook that kept its CUDA context. Ask the owner to end the process. Runbook:
                docs/runbook.md#gpumemoryheldwhileidle.
              ||| % $._config),
            },
          },
          {
            // namespace_pod_container:gpu_container_idle_seconds:min, from the series
            // themselves: a rule of another group would be read as of its last evaluation.
            // The container's least idle device, so a container busy on one of its GPUs is
            // not culled for another; the Jupyter user where the pod has one.
            alert: 'GpuHeldIdle',
            expr: |||
              (
                min by (%(clusterLabel)s, %(nodeLabel)s, namespace, pod, container) (
                  time() - gpu_container_last_active_timestamp_seconds{%(dcgmSelector)s}
                ) > %(heldIdleSeconds)d
              )
              * on (%(clusterLabel)s, namespace, pod) group_left (user)
              max by (%(clusterLabel)s, namespace, pod, user) (
                label_replace(gpu_pod_info{%(dcgmSelector)s}, "user", "$1", "%(userLabel)s", "(.*)")
              )
              or on (%(clusterLabel)s, %(nodeLabel)s, namespace, pod, container)
              min by (%(clusterLabel)s, %(nodeLabel)s, namespace, pod, container) (
                time() - gpu_container_last_active_timestamp_seconds{%(dcgmSelector)s}
              ) > %(heldIdleSeconds)d
            ||| % $._config,
            'for': '10m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'A container holds GPUs it has not used for a long time.',
              description: oneLine(|||
                Container {{ $labels.container }} of pod {{ $labels.namespace }}/{{ $labels.pod }}
                {{- with $labels.user }} (user {{ . }}){{ end }} on {{ $labels.%(nodeLabel)s }} holds GPU
                memory or an allocation and has not used any of its GPUs for
                {{ $value | humanizeDuration }} (over %(heldIdleSeconds)d s). Stop it, or let the
                culler do it (docs/culling.md). Runbook: docs/runbook.md#gpuheldidle.
              ||| % $._config),
            },
          },
          {
            alert: 'GpuUsedWithoutRequest',
            expr: |||
              sum by (%(clusterLabel)s, %(nodeLabel)s, gpu, UUID, GPU_I_ID, namespace, pod, container) (
                gpu_container_memory_used_bytes{%(dcgmSelector)s}
              )
              * on (%(clusterLabel)s, namespace, pod) group_left (workload_kind, workload_name, %(userLabel)s)
              max by (%(clusterLabel)s, namespace, pod, workload_kind, workload_name, %(userLabel)s) (
                gpu_pod_info{%(dcgmSelector)s, gpu_requested="false"}
              )
              unless on (%(clusterLabel)s, namespace, pod) gpu_container_allocated{%(dcgmSelector)s}
            ||| % $._config,
            'for': '15m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'A pod uses a GPU it never requested.',
              description: oneLine(|||
                Pod
                {{ $labels.namespace }}/{{ $labels.pod }}{{ with $labels.%(userLabel)s }}
                (user {{ . }}){{ end }} holds {{ $value | humanize1024 }}B on GPU {{ $labels.gpu }} of
                {{ $labels.%(nodeLabel)s }} but requested no nvidia.com resource, so the scheduler does not
                count it. Make it request a GPU, or stop exposing all GPUs to it
                (NVIDIA_VISIBLE_DEVICES=all). Runbook: docs/runbook.md#gpuusedwithoutrequest.
              ||| % $._config),
            },
          },
        ],
      },
      {
        name: 'dcgm-enricher.memory',
        rules: [
          {
            // Used and free in bytes, whichever naming each node's dcgm-exporter writes.
            alert: 'GpuMemoryNearlyFull',
            expr: |||
              %(deviceFbUsed)s
              / on (%(clusterLabel)s, %(nodeLabel)s, gpu, UUID, GPU_I_ID) group_left ()
              (
                %(fbUsed)s
                + %(fbFree)s
              ) > %(memoryNearlyFullRatio)g
            ||| % ($._config {
              local device = '%(clusterLabel)s, %(nodeLabel)s, gpu, UUID, GPU_I_ID' % $._config,
              deviceFbUsed: fields.read('fb_used', '%s, vgpu=""' % $._config.dcgmSelector),
              // Each name aggregated per device, then scaled (fields.aggregate).
              fbUsed: fields.aggregate('fb_used', 'max', device, $._config.dcgmSelector),
              fbFree: fields.aggregate('fb_free', 'max', device, $._config.dcgmSelector),
            }),
            'for': '15m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'GPU memory is over %(memoryNearlyFullPercent)s%% used.' % $._config,
              description: oneLine(|||
                GPU {{ $labels.gpu }}{{ with $labels.GPU_I_ID }} (MIG instance {{ . }}){{ end }} of
                {{ $labels.%(nodeLabel)s }} has {{ $value | humanizePercentage }} of its memory in
                use{{ with $labels.pod }} by pod {{ $labels.namespace }}/{{ . }}{{ end }}. The next
                allocation will fail with out-of-memory. Runbook: docs/runbook.md#gpumemorynearlyfull.
              ||| % $._config),
            },
          },
          {
            // A dynamic threshold over the container's own day: over its mean plus three standard
            // deviations, and at least 1 GiB above the mean. One clamp_min instead of a second
            // comparison: the day of every container's memory is read twice, not three times
            // (docs/performance.md#a-fleet-on-one-prometheus).
            alert: 'GpuPodMemoryGrowing',
            expr: |||
              gpu_container_memory_used_bytes{%(dcgmSelector)s}
              > avg_over_time(gpu_container_memory_used_bytes{%(dcgmSelector)s}[1d])
                + clamp_min(3 * stddev_over_time(gpu_container_memory_used_bytes{%(dcgmSelector)s}[1d]), %(memoryGrowthMinBytes)d)
            ||| % $._config,
            'for': '30m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'A container\'s GPU memory is growing far beyond its usual level.',
              description: oneLine(|||
                Container {{ $labels.container }} of pod {{ $labels.namespace }}/{{ $labels.pod }} holds
                {{ $value | humanize1024 }}B on GPU {{ $labels.gpu }} of {{ $labels.%(nodeLabel)s }}, above
                its mean plus three standard deviations over the last day: a leak or a changed batch
                size. Check it before the device fills up. Runbook: docs/runbook.md#gpupodmemorygrowing.
              ||| % $._config),
            },
          },
        ],
      },
      {
        name: 'dcgm-enricher.hardware',
        rules: [
          {
            // The xid field holds the last XID the driver reported on the GPU; the critical
            // codes are criticalXids (above).
            alert: 'GpuXidCriticalError',
            expr: std.join('\nor ', [
              '%s == %d' % [fields.read('xid', $._config.dcgmSelector), code]
              for code in criticalXids
            ]) + '\n',
            'for': '0m',
            labels: { severity: 'critical' },
            annotations: {
              summary: 'A GPU reported a critical XID error.',
              description: oneLine(|||
                GPU {{ $labels.gpu }} ({{ $labels.UUID }}) of {{ $labels.%(nodeLabel)s }} reported XID
                {{ $value }}{{ with $labels.pod }}, under pod {{ $labels.namespace }}/{{ . }}{{ end }}.
                Drain the GPU's workloads and follow the runbook for this code. Runbook:
                docs/runbook.md#gpuxidcriticalerror.
              ||| % $._config),
            },
          },
          {
            // Only when the value changes: DCGM keeps reporting the last XID, and a repeat of the
            // same code does not change it.
            alert: 'GpuXidError',
            expr: |||
              (%(xid)s > 0 and %(xidChanges)s > 0)
              unless
              (
                %(critical)s
              )
            ||| % {
              xid: fields.read('xid', $._config.dcgmSelector),
              // changes() counts: no scale; a GPU upgraded within the range changed under each name.
              xidChanges: fields.read('xid', $._config.dcgmSelector, function(s) 'changes(%s[15m])' % s, unitless=true, summed=true),
              critical: std.join('\n  or ', ['%s == %d' % [self.xid, code] for code in criticalXids]),
            },
            'for': '0m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'A GPU reported a new XID error.',
              description: oneLine(|||
                GPU {{ $labels.gpu }} of {{ $labels.%(nodeLabel)s }} reported XID {{ $value }} in the last 15
                minutes{{ with $labels.pod }}, under pod {{ $labels.namespace }}/{{ . }}{{ end }}. Codes
                such as 13, 31, 43 and 94 usually mean the application crashed or must restart; the GPU
                itself is fine. Runbook: docs/runbook.md#gpuxiderror.
              ||| % $._config),
            },
          },
          {
            alert: 'GpuTemperatureHigh',
            expr: |||
              max by (%(clusterLabel)s, %(nodeLabel)s, gpu, UUID, modelName) (%(temp)s) > %(temperatureCelsius)g
            ||| % ($._config { temp: fields.read('gpu_temp', $._config.dcgmSelector) }),
            'for': '10m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'A GPU is running hot.',
              description: oneLine(|||
                GPU {{ $labels.gpu }} of {{ $labels.%(nodeLabel)s }} has been at {{ $value }} °C for 10
                minutes; it will throttle its clocks. Check the node's cooling and fans. Runbook:
                docs/runbook.md#gputemperaturehigh.
              ||| % $._config),
            },
          },
          {
            alert: 'GpuRowRemapFailure',
            expr: |||
              max by (%(clusterLabel)s, %(nodeLabel)s, gpu, UUID, modelName) (%(failure)s) > 0
            ||| % ($._config { failure: fields.read('row_remap_failure', $._config.dcgmSelector) }),
            'for': '0m',
            labels: { severity: 'critical' },
            annotations: {
              summary: 'A GPU could not remap a faulty memory row.',
              description: oneLine(|||
                GPU {{ $labels.gpu }} ({{ $labels.UUID }}) of {{ $labels.%(nodeLabel)s }} has run out of
                spare memory rows. Take it out of service and have it replaced. Runbook:
                docs/runbook.md#gpurowremapfailure.
              ||| % $._config),
            },
          },
          {
            // The fabric_health field (opt-in in dcgm-exporter 4.8.4's counters) is NVML's
            // healthSummary: 0 not supported, 1 healthy, 2 unhealthy, 3 limited capacity.
            alert: 'GpuFabricUnhealthy',
            expr: |||
              max by (%(clusterLabel)s, %(nodeLabel)s, gpu, UUID, modelName) (%(health)s) >= 2
            ||| % ($._config { health: fields.read('fabric_health', $._config.dcgmSelector) }),
            'for': '5m',
            labels: { severity: 'critical' },
            annotations: {
              summary: "A GPU's NVLink fabric is unhealthy or at limited capacity.",
              description: oneLine(|||
                GPU {{ $labels.gpu }} ({{ $labels.UUID }}) of {{ $labels.%(nodeLabel)s }} reports its
                NVLink fabric {{ if eq $value 3.0 }}at limited capacity{{ else }}unhealthy{{ end }}
                (fabric health summary {{ $value }}) for 5 minutes: jobs that span its NVLink
                domain will fail or slow down. Runbook: docs/runbook.md#gpufabricunhealthy.
              ||| % $._config),
            },
          },
          {
            alert: 'GpuUncorrectableRemappedRows',
            expr: |||
              sum by (%(clusterLabel)s, %(nodeLabel)s, gpu, UUID, modelName) (
                %(remapped)s
              ) > 0
            ||| % ($._config {
              remapped: fields.read('uncorrectable_remapped_rows', $._config.dcgmSelector, function(s) 'increase(%s[1h])' % s, summed=true),
            }),
            'for': '0m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'A GPU remapped memory rows after uncorrectable errors.',
              description: oneLine(|||
                GPU {{ $labels.gpu }} of {{ $labels.%(nodeLabel)s }} remapped rows for uncorrectable memory
                errors in the last hour. The remap takes effect at the next GPU reset: drain the GPU and
                reset it. Runbook: docs/runbook.md#gpuuncorrectableremappedrows.
              ||| % $._config),
            },
          },
          {
            alert: 'GpuPcieReplaysHigh',
            expr: |||
              sum by (%(clusterLabel)s, %(nodeLabel)s, gpu, UUID, modelName) (
                %(replays)s
              ) * 60 > 8
            ||| % ($._config {
              replays: fields.read('pcie_replay', $._config.dcgmSelector, function(s) 'rate(%s[10m])' % s, summed=true),
            }),
            'for': '15m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'A GPU\'s PCIe link is retrying transfers.',
              description: oneLine(|||
                GPU {{ $labels.gpu }} of {{ $labels.%(nodeLabel)s }} replays {{ $value | humanize }} PCIe
                transfers a minute: a bad riser, slot or cable slows every job on it. Runbook:
                docs/runbook.md#gpupciereplayshigh.
              ||| % $._config),
            },
          },
          {
            // Seen in the last 6 hours, gone now, while other GPUs of the same node still report
            // (a whole node going quiet is GpuEnricherUpstreamDown or GpuEnricherDown).
            alert: 'GpuNotReporting',
            expr: |||
              (
                count by (%(clusterLabel)s, %(nodeLabel)s, gpu, UUID, modelName) (
                  %(seen)s
                )
                unless on (%(clusterLabel)s, %(nodeLabel)s, gpu, UUID) %(temp)s
              )
              and on (%(clusterLabel)s, %(nodeLabel)s) count by (%(clusterLabel)s, %(nodeLabel)s) (%(temp)s)
            ||| % ($._config {
              // A GPU that moved to another naming (its node's exporter upgraded) still reports.
              seen: fields.read('gpu_temp', $._config.dcgmSelector, function(s) 'last_over_time(%s[6h])' % s),
              temp: fields.read('gpu_temp', $._config.dcgmSelector),
            }),
            'for': '10m',
            labels: { severity: 'critical' },
            annotations: {
              summary: 'A GPU stopped reporting metrics.',
              description: oneLine(|||
                GPU {{ $labels.gpu }} ({{ $labels.UUID }}) of {{ $labels.%(nodeLabel)s }} has sent no metrics
                for 10 minutes while the node's other GPUs do: it may have fallen off the bus (XID 79).
                Check nvidia-smi on the node. Runbook: docs/runbook.md#gpunotreporting.
              ||| % $._config),
            },
          },
          {
            // The DRA driver's health report (gpu_device_taint, from the node's ResourceSlices)
            // on a device a container holds or runs on. One alert per container and device: a
            // device may carry several taints (PromQL cannot join two many sides), so the value
            // counts them and the description lists them.
            alert: 'GpuDeviceTainted',
            expr: |||
              group by (%(clusterLabel)s, %(nodeLabel)s, gpu, UUID, GPU_I_ID, namespace, pod, container) (
                gpu_container_allocated{%(dcgmSelector)s} or gpu_container_memory_used_bytes{%(dcgmSelector)s}
              )
              * on (%(clusterLabel)s, %(nodeLabel)s, gpu, UUID, GPU_I_ID) group_left ()
              count by (%(clusterLabel)s, %(nodeLabel)s, gpu, UUID, GPU_I_ID) (gpu_device_taint{%(dcgmSelector)s})
            ||| % $._config,
            'for': '5m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'A pod is using a GPU its DRA driver reports unhealthy.',
              description: oneLine(|||
                Container {{ $labels.container }} of pod {{ $labels.namespace }}/{{ $labels.pod }} uses
                GPU {{ $labels.gpu }}{{ with $labels.GPU_I_ID }} (MIG instance {{ . }}){{ end }} of
                {{ $labels.%(nodeLabel)s }}, on which the DRA driver has put {{ $value }} taint(s):{{ range
                printf `gpu_device_taint{%(clusterLabel)s="%%s", UUID="%%s", GPU_I_ID="%%s", %(dcgmSelector)s}`
                (index $labels "%(clusterLabel)s") $labels.UUID $labels.GPU_I_ID | query | sortByLabel
                "key" }}
                {{ .Labels.key }}{{ with .Labels.value }}={{ . }}{{ end }} ({{ .Labels.effect }}){{ end }}.
                The device is failing or no longer watched: move the workload to a healthy device and
                drain this one. Runbook: docs/runbook.md#gpudevicetainted.
              ||| % $._config),
            },
          },
        ],
      },
      {
        name: 'dcgm-enricher.enricher',
        rules: [
          {
            alert: 'GpuEnricherUpstreamDown',
            expr: 'dcgm_enricher_source_up{%(dcgmSelector)s, source="upstream"} == 0' % $._config,
            'for': '5m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'The enricher cannot read dcgm-exporter.',
              description: oneLine(|||
                dcgm-enricher {{ $labels.instance }} has failed to fetch dcgm-exporter's metrics for 5
                minutes: that node's GPU device metrics and hardware alerts are missing. Runbook:
                docs/runbook.md#gpuenricherupstreamdown.
              |||),
            },
          },
          {
            alert: 'GpuEnricherNvmlDown',
            expr: 'dcgm_enricher_source_up{%(dcgmSelector)s, source="nvml"} == 0' % $._config,
            'for': '10m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'The enricher cannot query NVML.',
              description: oneLine(|||
                dcgm-enricher {{ $labels.instance }} has not read the GPU process lists for 10 minutes:
                that node's GPU series are not attributed to pods. Runbook:
                docs/runbook.md#gpuenrichernvmldown.
              |||),
            },
          },
          {
            alert: 'GpuEnricherKubernetesDown',
            expr: 'dcgm_enricher_source_up{%(dcgmSelector)s, source="kubernetes"} == 0' % $._config,
            'for': '10m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'The enricher\'s pod watch is failing.',
              description: oneLine(|||
                dcgm-enricher {{ $labels.instance }} has not reached the Kubernetes API for 10 minutes;
                it serves its last known pods, and new pods show up as unattributed. Runbook:
                docs/runbook.md#gpuenricherkubernetesdown.
              |||),
            },
          },
          {
            alert: 'GpuEnricherProcfsDown',
            expr: 'dcgm_enricher_source_up{%(dcgmSelector)s, source="procfs"} == 0' % $._config,
            'for': '10m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'The enricher cannot read /proc for GPU processes.',
              description: oneLine(|||
                dcgm-enricher {{ $labels.instance }} has failed to read /proc/<pid> of some GPU
                processes for 10 minutes: their memory shows up as unattributed (reason
                proc_unreadable). Check the log for the path, hostPID and the procfs mount. Runbook:
                docs/runbook.md#gpuenricherprocfsdown.
              |||),
            },
          },
          {
            alert: 'GpuEnricherPodResourcesDown',
            expr: 'dcgm_enricher_source_up{%(dcgmSelector)s, source="podresources"} == 0' % $._config,
            'for': '10m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'The enricher cannot ask the kubelet which pods were allocated each GPU.',
              description: oneLine(|||
                dcgm-enricher {{ $labels.instance }} has failed to call the kubelet's PodResources API
                for 10 minutes (socket missing, not permitted or not answering): allocation series and
                allocated-but-idle alerts are off there. Check the log, the
                /var/lib/kubelet/pod-resources mount and the user; --no-kubelet.enabled switches it off.
                Runbook: docs/runbook.md#gpuenricherpodresourcesdown.
              |||),
            },
          },
          {
            alert: 'GpuEnricherResourceSlicesDown',
            expr: 'dcgm_enricher_source_up{%(dcgmSelector)s, source="resourceslices"} == 0' % $._config,
            'for': '10m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'The enricher cannot read the node\'s ResourceSlices for its DRA GPUs.',
              description: oneLine(|||
                dcgm-enricher {{ $labels.instance }} has failed to list this node's ResourceSlices for
                10 minutes (not permitted, or the API server not answering): GPUs allocated through DRA
                claims it has not seen before are counted in dcgm_enricher_podresources_unmapped_devices
                instead of gpu_container_allocated. Check the log and the ClusterRole (list on
                resource.k8s.io resourceslices); --no-kube.resource-slices switches it off. Runbook:
                docs/runbook.md#gpuenricherresourceslicesdown.
              |||),
            },
          },
          {
            alert: 'GpuEnricherDockerDown',
            expr: 'dcgm_enricher_source_up{%(dcgmSelector)s, source="docker"} == 0' % $._config,
            'for': '10m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'The enricher cannot reach the Docker Engine API.',
              description: oneLine(|||
                dcgm-enricher {{ $labels.instance }} has failed to talk to the Docker daemon for 10
                minutes: new containers are named by short ID, without image or compose labels. Check
                the daemon, the socket mount and the log; --docker.host="" switches to cgroup-only mode.
                Runbook: docs/runbook.md#gpuenricherdockerdown.
              |||),
            },
          },
          {
            // A field the enricher needs that the upstream's body has under no name the field
            // table knows: the next release renamed it again, or a counters file leaves it out.
            // The enricher reports it (dcgm_enricher_upstream_field_missing) and guesses nothing.
            alert: 'GpuEnricherUpstreamFieldMissing',
            expr: |||
              max by (%(clusterLabel)s, %(nodeLabel)s, field) (
                dcgm_enricher_upstream_field_missing{%(dcgmSelector)s}
              ) == 1
            ||| % $._config,
            'for': '15m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'A GPU exporter writes a field the enricher reads under an unknown name.',
              description: oneLine(|||
                The dcgm-exporter on {{ $labels.%(nodeLabel)s }} has written no {{ $labels.field }}
                under any name the enricher's field table knows for 15 minutes: a release that
                renamed it again, or a counters file without it. The panels, rules and splits that
                read it have no data there. Runbook: docs/runbook.md#gpuenricherupstreamfieldmissing.
              ||| % $._config),
            },
          },
          {
            // Both series come from the enricher's own target; only enrichers that know their
            // limit write dcgm_enricher_memory_limit_bytes, so other targets' process_* stay out.
            alert: 'GpuEnricherMemoryNearLimit',
            expr: |||
              process_resident_memory_bytes{%(dcgmSelector)s}
                / on (%(clusterLabel)s, %(nodeLabel)s, job, instance) dcgm_enricher_memory_limit_bytes{%(dcgmSelector)s}
              > %(enricherMemoryLimitRatio)g
            ||| % $._config,
            'for': '15m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'An enricher is close to its memory limit.',
              description: oneLine(|||
                dcgm-enricher {{ $labels.instance }} on {{ $labels.%(nodeLabel)s }} has held {{ $value |
                humanizePercentage }} of its memory limit for 15 minutes: at the limit the kernel
                kills it, and the node's GPU metrics stop until it is back. Raise the container's
                memory limit. Runbook: docs/runbook.md#gpuenrichermemorynearlimit.
              ||| % $._config),
            },
          },
          {
            // Processes only: the MPS server's own memory (reason mps_server) is infrastructure,
            // not misuse, and the device-level parts (driver_reserved, not_in_process_list) are
            // no process's.
            alert: 'GpuMemoryUnattributed',
            expr: |||
              sum by (%(clusterLabel)s, %(nodeLabel)s, gpu, UUID, GPU_I_ID, reason) (
                gpu_unattributed_memory_used_bytes{%(dcgmSelector)s, reason!~"mps_server|driver_reserved|not_in_process_list"}
              ) > 0
            ||| % $._config,
            'for': '15m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'GPU memory is held by processes that belong to no known pod.',
              description: oneLine(|||
                {{ $value | humanize1024 }}B on GPU {{ $labels.gpu }}{{ with $labels.GPU_I_ID }} (MIG
                instance {{ . }}){{ end }} of {{ $labels.%(nodeLabel)s }} belongs to processes the enricher
                cannot attribute to a pod (reason {{ $labels.reason }}). Run `dcgm-enricher ps` on the
                node to see them. Runbook: docs/runbook.md#gpumemoryunattributed.
              ||| % $._config),
            },
          },
          {
            alert: 'GpuEnricherDown',
            expr: 'up{%(enricherSelector)s} == 0' % $._config,
            'for': '5m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'Prometheus cannot scrape an enricher.',
              description: oneLine(|||
                The dcgm-enricher target {{ $labels.instance }} has been down for 5 minutes: the GPUs of
                its node are not monitored. Runbook: docs/runbook.md#gpuenricherdown.
              |||),
            },
          },
          {
            alert: 'GpuEnricherAbsent',
            expr: 'absent(up{%(enricherSelector)s} == 1)' % $._config,
            'for': '15m',
            labels: { severity: 'critical' },
            annotations: {
              summary: 'No dcgm-enricher is being scraped.',
              description: oneLine(|||
                Prometheus{{ with $externalLabels.%(clusterLabel)s }} of cluster {{ . }}{{ end }} has had no
                reachable dcgm-enricher target for 15 minutes: no GPU metrics at all. Check that the DaemonSet runs, that its ServiceMonitor, PodMonitor or scrape job is
                loaded, and that it sets the job label dcgm-enricher. Runbook:
                docs/runbook.md#gpuenricherabsent.
              ||| % $._config),
            },
          },
        ],
      },
    ], $._config),
  },
}
