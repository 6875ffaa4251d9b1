// dcgm-exporter's fields read by meaning, in their SI unit, whatever release wrote them: the
// rules and alerts name a field of the table (dcgm_fields.json beside this file, a copy of
// enricher/dcgm_fields.json that rules/generate.py writes, so that a vendored mixin has it),
// never one of its names.
//
// read('fb_used', 'node="a"') is every name the field has had, newest first, each with the
// same matchers and scaled to bytes, joined by `or` (4.9's name in bytes, 4.8's in MiB):
//   (<4.9 name>{node="a"} or <4.8 name>{node="a"} * 1048576)
// `or` matches on every label but __name__, so each device gives the series its exporter's
// release writes: one expression serves 4.8.4 and 4.10.0 nodes in one Prometheus, with no
// record added. devkit/fieldquery.py builds the same text for the dashboards (a test holds
// the two equal).
local table = import 'dcgm_fields.json';
local namings = [n.naming for n in table.namings];
local rows = { [row.field]: row for row in table.fields };

{
  // [[name, scale to the SI unit]] of a field, newest naming first, each name once. A naming
  // the row does not list keeps the previous naming's name.
  namesAndScales(field)::
    local row = rows[field];
    local entries = std.foldl(
      function(acc, naming)
        acc + [
          if std.objectHas(row.names, naming) then row.names[naming]
          else if std.length(acc) > 0 then acc[std.length(acc) - 1]
          else null,
        ],
      namings,
      []
    );
    std.foldl(
      function(acc, e)
        if std.length([a for a in acc if a[0] == e.name]) > 0 then acc
        else acc + [[e.name, table.units[e.unit][1]]],
      std.reverse([e for e in entries if e != null]),
      []
    ),

  // expr times scale: nothing for 1, a division by the inverse under 1 (exact for percent
  // and mJ: 97 / 100 is the double 0.97), else a product.
  scaled(expr, scale)::
    if scale == 1 then expr
    else if scale < 1 then '%s / %s' % [expr, std.toString(std.floor(1 / scale + 0.5))]
    else '%s * %s' % [expr, std.toString(scale)],

  // The field in its SI unit: `matchers` in each selector's braces; `over` wraps each selector
  // (function(s) 'rate(%s[10m])' % s) before its scale applies, right for functions linear in
  // the value; `unitless` leaves the scale off (changes, resets: they count). `summed` adds
  // the names' answers up per series instead of taking the newest: a range function over a
  // counter, where a device upgraded within the range has a part under each name and its rate
  // is their sum (each part alone reads low, as rate() of a short series does).
  read(field, matchers='', over=function(s) s, unitless=false, summed=false)::
    local found = $.namesAndScales(field);
    local braces = if matchers == '' then '' else '{%s}' % matchers;
    local terms = [
      local s = over(f[0] + braces);
      if unitless then s else $.scaled(s, f[1])
      for f in found
    ];
    if std.length(terms) == 1 && terms[0] == over(found[0][0] + braces)
    then terms[0]
    else if !summed then '(' + std.join(' or ', terms) + ')'
    else 'sum without (dcgm_naming) (' + std.join(' or ', [terms[0]] + [
      'label_replace(%s, "dcgm_naming", "%d", "", "")' % [terms[i], i]
      for i in std.range(1, std.length(terms) - 1)
    ]) + ')',

  // op by (by) (the field) in its SI unit (op: sum, max, min or count): each name aggregated,
  // then scaled once per group (scaling every series first costs several times the
  // aggregation), the names' aggregates combined by op's combiner (a group may hold devices
  // of both namings). devkit/fieldquery.aggregate, the same text.
  aggregate(field, op, by, matchers='', over=function(s) s, unitless=false)::
    local found = $.namesAndScales(field);
    local braces = if matchers == '' then '' else '{%s}' % matchers;
    local head = if by == '' then op else '%s by (%s)' % [op, by];
    local combine = { sum: 'sum', count: 'sum', max: 'max', min: 'min' }[op];
    local terms = [
      local t = '%s (%s)' % [head, over(found[i][0] + braces)];
      local s = if unitless || op == 'count' then t else $.scaled(t, found[i][1]);
      if i == 0 then s else 'label_replace(%s, "dcgm_naming", "%d", "", "")' % [s, i]
      for i in std.range(0, std.length(found) - 1)
    ];
    if std.length(terms) == 1 then terms[0]
    else '%s without (dcgm_naming) (%s)' % [combine, std.join(' or ', terms)],
}
