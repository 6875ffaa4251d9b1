// The dashboard: its panels, queries and variables are built by grafana/generate.py (with
// grafana-foundation-sdk) into dcgm-enricher.json, whose queries hold `%(name)s` references
// to `_config`; here they are filled in, with the uid, title and refresh.
local utils = import '../lib/utils.libsonnet';

{
  grafanaDashboards+:: {
    'dcgm-enricher.json': utils.dashboard(import 'dcgm-enricher.json', $._config) {
      uid: $._config.dashboardUid,
      title: $._config.dashboardTitle,
      refresh: $._config.dashboardRefresh,
    },
  },
}
