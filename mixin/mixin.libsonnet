// The dcgm-enricher monitoring mixin: `_config`, `prometheusAlerts`, `prometheusRules` and
// `grafanaDashboards`, as the monitoring-mixins conventions lay them out. docs/alerts.md and
// docs/dashboard.md say how to vendor it and override `_config`.
(import 'config.libsonnet') +
(import 'alerts/alerts.libsonnet') +
(import 'rules/rules.libsonnet') +
(import 'dashboards/dashboards.libsonnet')
