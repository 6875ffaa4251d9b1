// Helpers shared by the rule and alert files.
{
  // A description written as a text block, folded into one line (YAML's `>-`).
  oneLine(text):: std.strReplace(std.rstripChars(text, '\n'), '\n', ' '),

  // Every series selector is written `metric{%(dcgmSelector)s}` or
  // `metric{%(dcgmSelector)s, label="value"}`: with an empty selector (the default) that
  // leaves `{}` or `{, `, which this removes, so the default build reads as plain PromQL.
  tidySelectors(expr):: std.strReplace(std.strReplace(expr, '{, ', '{'), '{}', ''),

  // The groups with tidy expressions and, when config.runbookURLPattern is set, a runbook_url
  // on every alert: the pattern with the alert's anchor in docs/runbook.md (its name in
  // lower case) for `%s`.
  groups(groups, config):: [
    group {
      rules: [
        rule {
          expr: $.tidySelectors(rule.expr),
          [if 'alert' in rule && config.runbookURLPattern != '' then 'annotations']+: {
            runbook_url: config.runbookURLPattern % std.asciiLower(rule.alert),
          },
        }
        for rule in group.rules
      ],
    }
    for group in groups
  ],

  // A query of the dashboard's template with `_config` filled in.
  query(text, config):: $.tidySelectors(text % config),

  // A text of the template that names a label of `_config` (a legend, a table column):
  // filled in where it holds a `%(name)s` reference, left as it is otherwise.
  named(text, config):: if std.length(std.findSubstr('%(', text)) > 0 then text % config else text,

  // The dashboard's template with `_config` in every query (panel targets, variable
  // definitions and queries, annotation queries) and in the descriptions, legends, annotation
  // texts, table column names and links that name a threshold, a label or a uid of it.
  dashboard(template, config)::
    local named(text) = $.named(text, config);
    local target(t) = t
                      + (if 'expr' in t then { expr: $.query(t.expr, config) } else {})
                      + (if 'legendFormat' in t then { legendFormat: named(t.legendFormat) } else {})
                      + (if 'textFormat' in t then { textFormat: named(t.textFormat) } else {});
    local organize(options) = options + (
      if 'renameByName' in options
      then { renameByName: { [named(k)]: options.renameByName[k] for k in std.objectFields(options.renameByName) } }
      else {}
    );
    local transformation(x) = x + (if x.id == 'organize' then { options: organize(x.options) } else {});
    // A table column's data links: their URLs name the dashboards' uids.
    local link(l) = l + { url: named(l.url) };
    local property(p) = p + (if p.id == 'links' then { value: std.map(link, p.value) } else {});
    local override(o) = o + { properties: std.map(property, o.properties) };
    local fieldConfig(p) =
      if 'fieldConfig' in p && 'overrides' in p.fieldConfig
      then { fieldConfig+: { overrides: std.map(override, p.fieldConfig.overrides) } }
      else {};
    local panel(p) = p
                     + (if 'description' in p then { description: named(p.description) } else {})
                     + (if 'targets' in p then { targets: std.map(target, p.targets) } else {})
                     + (if 'transformations' in p then { transformations: std.map(transformation, p.transformations) } else {})
                     + fieldConfig(p)
                     + (if 'panels' in p then { panels: std.map(panel, p.panels) } else {});
    local variable(v) =
      v
      + (if 'definition' in v then { definition: $.query(v.definition, config) } else {})
      + (if std.isObject(std.get(v, 'query')) then { query+: { query: $.query(v.query.query, config) } } else {});
    template {
      panels: std.map(panel, template.panels),
      templating+: { list: std.map(variable, template.templating.list) },
      annotations+: { list: std.map(target, template.annotations.list) },
    },
}
