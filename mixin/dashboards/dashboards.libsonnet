// The dashboards: their panels, queries and variables are built by grafana/generate.py (with
// grafana-foundation-sdk, one module of grafana/boards/ each) into the JSON files here, whose
// queries and links hold `%(name)s` references to `_config`; here they are filled in, with
// each one's uid, title and refresh.
local utils = import '../lib/utils.libsonnet';

local board(template, key, config) = utils.dashboard(template, config) {
  uid: config[key + 'DashboardUid'],
  title: config[key + 'DashboardTitle'],
  refresh: config.dashboardRefresh,
};

{
  grafanaDashboards+:: {
    'dcgm-enricher.json': board(import 'dcgm-enricher.json', 'cluster', $._config),
    'dcgm-enricher-namespace.json': board(import 'dcgm-enricher-namespace.json', 'namespace', $._config),
    'dcgm-enricher-pod.json': board(import 'dcgm-enricher-pod.json', 'pod', $._config),
    'dcgm-enricher-node.json': board(import 'dcgm-enricher-node.json', 'node', $._config),
    'dcgm-enricher-self.json': board(import 'dcgm-enricher-self.json', 'enricher', $._config),
  },
}
