"""Build the dcgm-enricher mixin with jsonnet (PyPI's ``jsonnet``, the C++ implementation).

    python mixin/build.py                      # mixin/prometheus_alerts.yaml,
                                               # mixin/prometheus_rules.yaml, mixin/dashboards_out/
    python mixin/build.py --out DIR            # the same files under DIR
    python mixin/build.py --config "{ dcgmSelector: 'job=\\"gpu\\"' }"  # with _config overridden

What `jsonnet -J vendor -S -e 'std.manifestYamlDoc((import "mixin.libsonnet").prometheusAlerts)'`
writes, for the three outputs the monitoring-mixins conventions name. rules/generate.py and
grafana/generate.py write the files that the manifests, the chart and the Compose stack ship from
the same build with the default ``_config``.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import sys
from pathlib import Path

import _jsonnet
import yaml

MIXIN = Path(__file__).resolve().parent
ALERTS = "prometheus_alerts.yaml"
RULES = "prometheus_rules.yaml"
DASHBOARDS = "dashboards_out"


def mixin_code(config: str | None = None) -> str:
    """Jsonnet for the mixin, with ``config`` (a jsonnet object) merged into its ``_config``."""
    code = "(import 'mixin.libsonnet')"
    if config:
        code += f" + {{ _config+:: {config} }}"
    return code


def evaluate(expr: str, config: str | None = None) -> str:
    """The string that jsonnet makes of ``expr`` (jsonnet, with ``mixin`` bound to the mixin).

    One build of the rules takes seconds: an answer is kept for the life of the process while
    the mixin's sources stay as they were (their sizes and modification times), so that the
    generators and the tests that ask for the same build share one."""
    return _evaluate(expr, config, _sources())


def _sources() -> tuple[tuple[str, int, int], ...]:
    """The mixin's source files (jsonnet, and the dashboard template), each with its size and
    modification time."""
    found = []
    for path in sorted(MIXIN.rglob("*")):
        if path.suffix in (".libsonnet", ".jsonnet", ".json") and DASHBOARDS not in path.parts:
            st = path.stat()
            found.append((str(path), st.st_size, st.st_mtime_ns))
    return tuple(found)


@functools.lru_cache(maxsize=64)
def _evaluate(expr: str, config: str | None, sources: tuple[tuple[str, int, int], ...]) -> str:
    del sources  # the cache's key only
    snippet = f"local mixin = {mixin_code(config)};\n{expr}"
    text: str = _jsonnet.evaluate_snippet(str(MIXIN / "build.jsonnet"), snippet)
    return text


# A mapping key as std.manifestYamlDoc quotes it: a line's first token after its indent (and
# any "- " of a list item), a JSON string of one bare word.
_QUOTED_KEY = re.compile(r'^( *(?:- )*)"([A-Za-z_][A-Za-z0-9_]*)":(?= |$)', re.MULTILINE)


def yaml_doc(field: str, config: str | None = None) -> str:
    """A field of the mixin as a YAML document, written by jsonnet: what
    ``std.manifestYamlDoc(field, indent_array_in_object=true, quote_keys=false)`` writes.

    The C++ jsonnet takes about 14 s on the rules with ``quote_keys=false`` (its check of each
    key for bare safety) and under 4 s with ``quote_keys=true``: this asks for the quoted
    document and unquotes its keys, which are all bare words, and checks that the YAML read
    back is the same data (a key YAML would read otherwise, such as ``on``, fails here).
    tests/test_mixin.py holds the bytes equal to jsonnet's own ``quote_keys=false``."""
    quoted = json.loads(
        evaluate(
            f"std.manifestYamlDoc({field}, indent_array_in_object=true, quote_keys=true)", config
        )
    )
    assert isinstance(quoted, str)
    text = _QUOTED_KEY.sub(r"\1\2:", quoted)
    if yaml.safe_load(text) != yaml.safe_load(quoted):
        raise ValueError(f"{field}: a key that YAML reads as something else when unquoted")
    return text + "\n"


def yaml_doc_by_jsonnet(field: str, config: str | None = None) -> str:
    """``yaml_doc`` the slow way, all of it by jsonnet (the equivalence's oracle)."""
    text = json.loads(
        evaluate(
            f"std.manifestYamlDoc({field}, indent_array_in_object=true, quote_keys=false)", config
        )
    )
    assert isinstance(text, str)
    return text + "\n"


def rule_file(config: str | None = None) -> str:
    """The recording rules' groups, then the alerts', in one rule file (what is shipped)."""
    return yaml_doc(
        "{ groups: mixin.prometheusRules.groups + mixin.prometheusAlerts.groups }", config
    )


def dashboards(config: str | None = None) -> dict[str, str]:
    """Each dashboard's file name and JSON text (two-space indent, keys as jsonnet orders them)."""
    boards = json.loads(evaluate("mixin.grafanaDashboards", config))
    return {
        name: json.dumps(board, indent=2, ensure_ascii=False) + "\n"
        for name, board in boards.items()
    }


def build(config: str | None = None) -> dict[str, str]:
    """Every output file (relative path) and its text."""
    out = {
        ALERTS: yaml_doc("mixin.prometheusAlerts", config),
        RULES: yaml_doc("mixin.prometheusRules", config),
    }
    out.update({f"{DASHBOARDS}/{name}": text for name, text in dashboards(config).items()})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=MIXIN, help="where to write (default: mixin/)")
    parser.add_argument(
        "--config", metavar="JSONNET", help="a jsonnet object merged into the mixin's _config"
    )
    args = parser.parse_args(argv)
    for name, text in build(args.config).items():
        path = args.out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
