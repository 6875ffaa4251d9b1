local fields = import '../lib/fields.libsonnet';
local utils = import '../lib/utils.libsonnet';
local oneLine = utils.oneLine;

{
  prometheusRules+:: {
    groups+: utils.groups([
      {
        name: 'dcgm-enricher.records',
        rules: [
          {
            // Allocated but idle, defined once for GpuAllocatedIdle and the dashboard's panels:
            // each device the kubelet allocated to a container that has no process on it, or
            // only processes under idleUtilizationThreshold of SM (on MIG, where NVML has no
            // per-process utilization, a process counts as use). It keeps exported_namespace,
            // exported_pod and exported_container for the panels where Prometheus scrapes with
            // honor_labels: false.
            record: 'namespace_pod_container_device:gpu_allocated_idle:max',
            expr: |||
              max by (%(clusterLabel)s, %(nodeLabel)s, gpu, UUID, GPU_I_ID, namespace, pod, container, exported_namespace, exported_pod, exported_container) (
                gpu_container_allocated{%(dcgmSelector)s}
              )
              unless on (%(clusterLabel)s, %(nodeLabel)s, gpu, UUID, GPU_I_ID, namespace, pod, container, exported_namespace, exported_pod, exported_container)
              (
                gpu_container_utilization_ratio{%(dcgmSelector)s} > %(idleUtilizationThreshold)g
                or
                (
                  gpu_container_memory_used_bytes{%(dcgmSelector)s}
                  unless on (%(clusterLabel)s, %(nodeLabel)s, gpu, UUID, GPU_I_ID, namespace, pod, container, exported_namespace, exported_pod, exported_container)
                  gpu_container_utilization_ratio{%(dcgmSelector)s}
                )
              )
            ||| % $._config,
          },
          {
            // One series per pod with a GPU process: its workload and its JupyterHub user (the
            // allow-listed annotation on gpu_pod_info, renamed `user`), for joins below.
            record: 'namespace_pod:gpu_pod_info:max',
            expr: |||
              max by (%(clusterLabel)s, namespace, pod, workload_kind, workload_name, user) (
                label_replace(gpu_pod_info{%(dcgmSelector)s}, "user", "$1", "%(userLabel)s", "(.*)")
              )
            ||| % $._config,
          },
          {
            record: 'namespace:gpu_container_memory_used_bytes:sum',
            expr: 'sum by (%(clusterLabel)s, namespace) (gpu_container_memory_used_bytes{%(dcgmSelector)s})' % $._config,
          },
          {
            // GPU-equivalents of SM time: 1 is one GPU kept fully busy (no MIG: NVML has no
            // per-process utilization there).
            record: 'namespace:gpu_container_utilization_ratio:sum',
            expr: 'sum by (%(clusterLabel)s, namespace) (gpu_container_utilization_ratio{%(dcgmSelector)s})' % $._config,
          },
          {
            record: 'namespace_workload:gpu_container_memory_used_bytes:sum',
            expr: |||
              sum by (%(clusterLabel)s, namespace, workload_kind, workload_name) (
                sum by (%(clusterLabel)s, namespace, pod) (gpu_container_memory_used_bytes{%(dcgmSelector)s})
                * on (%(clusterLabel)s, namespace, pod) group_left (workload_kind, workload_name)
                namespace_pod:gpu_pod_info:max
              )
            ||| % $._config,
          },
          {
            record: 'namespace_workload:gpu_container_utilization_ratio:sum',
            expr: |||
              sum by (%(clusterLabel)s, namespace, workload_kind, workload_name) (
                sum by (%(clusterLabel)s, namespace, pod) (gpu_container_utilization_ratio{%(dcgmSelector)s})
                * on (%(clusterLabel)s, namespace, pod) group_left (workload_kind, workload_name)
                namespace_pod:gpu_pod_info:max
              )
            ||| % $._config,
          },
          {
            record: 'user:gpu_container_memory_used_bytes:sum',
            expr: |||
              sum by (%(clusterLabel)s, user) (
                sum by (%(clusterLabel)s, namespace, pod) (gpu_container_memory_used_bytes{%(dcgmSelector)s})
                * on (%(clusterLabel)s, namespace, pod) group_left (user)
                namespace_pod:gpu_pod_info:max{user!=""}
              )
            ||| % $._config,
          },
          {
            record: 'user:gpu_container_utilization_ratio:sum',
            expr: |||
              sum by (%(clusterLabel)s, user) (
                sum by (%(clusterLabel)s, namespace, pod) (gpu_container_utilization_ratio{%(dcgmSelector)s})
                * on (%(clusterLabel)s, namespace, pod) group_left (user)
                namespace_pod:gpu_pod_info:max{user!=""}
              )
            ||| % $._config,
          },
          {
            // Seconds since each container last used a GPU it holds (memory or an allocation),
            // from its least idle device (gpu_container_last_active_timestamp_seconds,
            // docs/metrics.md#idle-since), with its workload and JupyterHub user where it has a
            // GPU process: what GpuHeldIdle and the culling recipes (docs/culling.md) read.
            record: 'namespace_pod_container:gpu_container_idle_seconds:min',
            expr: |||
              (
                min by (%(clusterLabel)s, %(nodeLabel)s, namespace, pod, container) (
                  time() - gpu_container_last_active_timestamp_seconds{%(dcgmSelector)s}
                )
                * on (%(clusterLabel)s, namespace, pod) group_left (workload_kind, workload_name, user)
                namespace_pod:gpu_pod_info:max
              )
              or on (%(clusterLabel)s, %(nodeLabel)s, namespace, pod, container)
              min by (%(clusterLabel)s, %(nodeLabel)s, namespace, pod, container) (
                time() - gpu_container_last_active_timestamp_seconds{%(dcgmSelector)s}
              )
            ||| % $._config,
          },
          {
            // Devices (GPUs, MIG instances, shared-GPU replicas) the kubelet allocated, by resource
            // name (nvidia.com/gpu, nvidia.com/mig-1g.10gb, nvidia.com/gpu.shared, ...).
            record: 'namespace:gpu_container_allocated:sum',
            expr: 'sum by (%(clusterLabel)s, namespace, resource) (gpu_container_allocated{%(dcgmSelector)s})' % $._config,
          },
          {
            // Devices in use by the namespace's processes, whether allocated or not: a device shared
            // by several containers is split evenly between them. A MIG instance counts as one
            // device; its GPU_I_PROFILE label tells the slice size for pricing.
            record: 'namespace:gpu_in_use:sum',
            expr: |||
              sum by (%(clusterLabel)s, namespace, GPU_I_PROFILE) (
                count by (%(clusterLabel)s, %(nodeLabel)s, gpu, UUID, GPU_I_ID, GPU_I_PROFILE, namespace) (
                  gpu_container_memory_used_bytes{%(dcgmSelector)s}
                )
                / on (%(clusterLabel)s, %(nodeLabel)s, gpu, UUID, GPU_I_ID) group_left ()
                count by (%(clusterLabel)s, %(nodeLabel)s, gpu, UUID, GPU_I_ID) (gpu_container_memory_used_bytes{%(dcgmSelector)s})
              )
            ||| % $._config,
          },
          {
            // Right-sizing: the most memory one replica of a workload holds on one device (GPU or MIG
            // instance), now and at its peak over a day. Under 10, 20 or 40 GiB, a MIG slice of that
            // size would do.
            record: 'namespace_workload:gpu_memory_per_device_bytes:max',
            expr: |||
              max by (%(clusterLabel)s, namespace, workload_kind, workload_name) (
                sum by (%(clusterLabel)s, %(nodeLabel)s, gpu, UUID, GPU_I_ID, namespace, pod) (
                  gpu_container_memory_used_bytes{%(dcgmSelector)s}
                )
                * on (%(clusterLabel)s, namespace, pod) group_left (workload_kind, workload_name)
                namespace_pod:gpu_pod_info:max
              )
            ||| % $._config,
          },
          {
            record: 'namespace_workload:gpu_memory_per_device_bytes:max_over_time1d',
            expr: 'max_over_time(namespace_workload:gpu_memory_per_device_bytes:max[1d])' % $._config,
          },
          {
            // Power and energy (docs/power.md): each container's share of its GPU's draw, and the
            // joules attributed over the last hour (kWh: divide by 3.6e6). A day or a month:
            //   sum_over_time(namespace:gpu_container_energy_joules:increase1h[1d:1h])
            // The workload and user records join on the pods seen with a GPU process in that hour: a
            // pod that only holds an allocation has no gpu_pod_info, so its energy is counted in its
            // namespace only.
            record: 'namespace:gpu_container_power_watts:sum',
            expr: 'sum by (%(clusterLabel)s, namespace) (gpu_container_power_watts{%(dcgmSelector)s})' % $._config,
          },
          {
            record: 'namespace:gpu_container_energy_joules:increase1h',
            expr: 'sum by (%(clusterLabel)s, namespace) (increase(gpu_container_energy_joules_total{%(dcgmSelector)s}[1h]))' % $._config,
          },
          {
            record: 'namespace_workload:gpu_container_energy_joules:increase1h',
            expr: |||
              sum by (%(clusterLabel)s, namespace, workload_kind, workload_name) (
                sum by (%(clusterLabel)s, namespace, pod) (increase(gpu_container_energy_joules_total{%(dcgmSelector)s}[1h]))
                * on (%(clusterLabel)s, namespace, pod) group_left (workload_kind, workload_name)
                max by (%(clusterLabel)s, namespace, pod, workload_kind, workload_name) (
                  max_over_time(namespace_pod:gpu_pod_info:max[1h])
                )
              )
            ||| % $._config,
          },
          {
            record: 'user:gpu_container_energy_joules:increase1h',
            expr: |||
              sum by (%(clusterLabel)s, user) (
                sum by (%(clusterLabel)s, namespace, pod) (increase(gpu_container_energy_joules_total{%(dcgmSelector)s}[1h]))
                * on (%(clusterLabel)s, namespace, pod) group_left (user)
                max by (%(clusterLabel)s, namespace, pod, user) (
                  max_over_time(namespace_pod:gpu_pod_info:max{user!=""}[1h])
                )
              )
            ||| % $._config,
          },
        ],
      },
      {
        // What the dashboard's panels read where reading the raw series at every step of a panel
        // costs tens of times a plain sum on a large fleet (docs/performance.md#a-fleet-on-one-prometheus):
        // a group of its own, so that these joins run beside the other groups, not after them.
        // Every one reads raw series only, so `promtool tsdb create-blocks-from rules` can
        // backfill them; none is read by another rule.
        name: 'dcgm-enricher.dashboard',
        rules: [
          {
            // What the dashboard's memory and utilization panels read (grafana/generate.py): each
            // pod's memory and SM use on each device, joined to its workload and JupyterHub user
            // once per evaluation instead of at every step of every panel. They keep every label
            // a dashboard variable filters on; exported_namespace and exported_pod too, so that
            // the panels' ${label_prefix} finds the pod where Prometheus scrapes with
            // honor_labels: false (absent labels vanish from a `by`). They join gpu_pod_info
            // itself, not a record, so `promtool tsdb create-blocks-from rules` can backfill them.
            record: 'namespace_pod_device:gpu_container_memory_used_bytes:sum',
            expr: |||
              sum by (%(clusterLabel)s, %(nodeLabel)s, gpu, GPU_I_ID, namespace, pod, exported_namespace, exported_pod) (
                gpu_container_memory_used_bytes{%(dcgmSelector)s}
              )
              * on (%(clusterLabel)s, namespace, pod, exported_namespace, exported_pod) group_left (workload_kind, workload_name, user)
              max by (%(clusterLabel)s, namespace, pod, exported_namespace, exported_pod, workload_kind, workload_name, user) (
                label_replace(gpu_pod_info{%(dcgmSelector)s}, "user", "$1", "%(userLabel)s", "(.*)")
              )
            ||| % $._config,
          },
          {
            record: 'namespace_pod_device:gpu_container_utilization_ratio:sum',
            expr: |||
              sum by (%(clusterLabel)s, %(nodeLabel)s, gpu, GPU_I_ID, namespace, pod, exported_namespace, exported_pod) (
                gpu_container_utilization_ratio{%(dcgmSelector)s}
              )
              * on (%(clusterLabel)s, namespace, pod, exported_namespace, exported_pod) group_left (workload_kind, workload_name, user)
              max by (%(clusterLabel)s, namespace, pod, exported_namespace, exported_pod, workload_kind, workload_name, user) (
                label_replace(gpu_pod_info{%(dcgmSelector)s}, "user", "$1", "%(userLabel)s", "(.*)")
              )
            ||| % $._config,
          },
          {
            // When each container last used each GPU it holds, with its workload and JupyterHub
            // user where it has a GPU process (an allocation alone has no gpu_pod_info: its
            // series is kept without them): the "Idle since" table.
            record: 'namespace_pod_container_device:gpu_container_last_active_timestamp_seconds:max',
            expr: |||
              max by (%(clusterLabel)s, %(nodeLabel)s, gpu, GPU_I_ID, namespace, pod, container, exported_namespace, exported_pod, exported_container) (
                gpu_container_last_active_timestamp_seconds{%(dcgmSelector)s}
              )
              * on (%(clusterLabel)s, namespace, pod, exported_namespace, exported_pod) group_left (workload_kind, workload_name, user)
              max by (%(clusterLabel)s, namespace, pod, exported_namespace, exported_pod, workload_kind, workload_name, user) (
                label_replace(gpu_pod_info{%(dcgmSelector)s}, "user", "$1", "%(userLabel)s", "(.*)")
              )
              or on (%(clusterLabel)s, %(nodeLabel)s, gpu, GPU_I_ID, namespace, pod, container, exported_namespace, exported_pod, exported_container)
              max by (%(clusterLabel)s, %(nodeLabel)s, gpu, GPU_I_ID, namespace, pod, container, exported_namespace, exported_pod, exported_container) (
                gpu_container_last_active_timestamp_seconds{%(dcgmSelector)s}
              )
            ||| % $._config,
          },
          {
            // Pods with a GPU process on each device (GPU or MIG instance): the shared-device
            // panels keep the devices where this is over 1.
            record: 'device:gpu_pods:count',
            expr: |||
              count by (%(clusterLabel)s, %(nodeLabel)s, gpu, GPU_I_ID) (
                count by (%(clusterLabel)s, %(nodeLabel)s, gpu, GPU_I_ID, namespace, pod, exported_namespace, exported_pod) (
                  gpu_container_memory_used_bytes{%(dcgmSelector)s}
                )
              )
            ||| % $._config,
          },
          {
            // Containers with a GPU process on each device: a shared device splits between them
            // in the "Allocated and in use" panel, as namespace:gpu_in_use:sum does.
            record: 'device:gpu_containers:count',
            expr: 'count by (%(clusterLabel)s, %(nodeLabel)s, gpu, GPU_I_ID) (gpu_container_memory_used_bytes{%(dcgmSelector)s})' % $._config,
          },
          {
            // Each pod's watts on each GPU that more than one pod draws on (its MIG instances
            // together: they share its power): "Watts by pod on shared GPUs".
            record: 'namespace_pod_gpu:gpu_container_power_watts:sum_on_shared',
            expr: |||
              sum by (%(clusterLabel)s, %(nodeLabel)s, gpu, namespace, pod, exported_namespace, exported_pod) (
                gpu_container_power_watts{%(dcgmSelector)s}
              )
              and on (%(clusterLabel)s, %(nodeLabel)s, gpu)
              (
                count by (%(clusterLabel)s, %(nodeLabel)s, gpu) (
                  count by (%(clusterLabel)s, %(nodeLabel)s, gpu, namespace, pod, exported_namespace, exported_pod) (
                    gpu_container_power_watts{%(dcgmSelector)s}
                  )
                ) > 1
              )
            ||| % $._config,
          },
          {
            // The share of each GPU's (or MIG instance's) memory in use: "Device memory used".
            // Used and free in bytes, whichever naming each node's dcgm-exporter writes.
            record: 'device:gpu_memory_used:ratio',
            // Each name aggregated per device, then scaled (fields.aggregate).
            expr: |||
              %(used)s
              / (
                %(used)s
                + %(free)s
              )
            ||| % {
              local device = '%(clusterLabel)s, %(nodeLabel)s, gpu, UUID, GPU_I_ID' % $._config,
              used: fields.aggregate('fb_used', 'max', device, $._config.dcgmSelector),
              free: fields.aggregate('fb_free', 'max', device, $._config.dcgmSelector),
            },
          },
        ],
      },
      {
        // Chargeback: GPU-hours accrued over the last hour, the share of a 15 s grid on which the
        // namespace held (or used) each device: a GPU held for half the hour is 0.5. A month:
        //   sum_over_time(namespace:gpu_allocated_hours:increase1h[30d:1h])
        name: 'dcgm-enricher.chargeback',
        rules: [
          {
            record: 'namespace:gpu_allocated_hours:increase1h',
            expr: |||
              sum_over_time(namespace:gpu_container_allocated:sum[1h:15s])
              / on () group_left ()
              count_over_time(vector(1)[1h:15s])
            ||| % $._config,
          },
          {
            record: 'namespace:gpu_in_use_hours:increase1h',
            expr: |||
              sum_over_time(namespace:gpu_in_use:sum[1h:15s])
              / on () group_left ()
              count_over_time(vector(1)[1h:15s])
            ||| % $._config,
          },
          {
            record: 'namespace:gpu_sm_active_hours:increase1h',
            expr: |||
              sum_over_time(namespace:gpu_container_utilization_ratio:sum[1h:15s])
              / on () group_left ()
              count_over_time(vector(1)[1h:15s])
            ||| % $._config,
          },
        ],
      },
    ], $._config),
  },
}
