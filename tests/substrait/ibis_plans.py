"""Writes ibis-*.json: Substrait plans made by a producer other than DataFusion
(ibis-substrait), which tests/substrait_producers.rs runs.

Made with Python 3.11 and, from PyPI: ibis-framework==9.5.0, ibis-substrait==4.0.1,
substrait==0.21.0 (later versions of that package break ibis-substrait 4.0.1).

    python3 ibis_plans.py OUT_DIR AI_EXTENSION_YAML

where AI_EXTENSION_YAML is bench/quailb/plans/substrait_extensions.yaml without its
`%YAML`, `---` and `urn:` lines (ibis-substrait reads every top-level key as a
function list). The AI functions are declared as ibis builtin UDFs and mapped to
the extension's names; ibis-substrait names argument types `str`, the YAML `string`.
ai_classify is left out: ibis-substrait 4.0.1 cannot type a list argument.
"""
import sys
import ibis
from ibis_substrait.compiler.core import SubstraitCompiler
from ibis_substrait.compiler.mapping import register_extension_yaml, IBIS_SUBSTRAIT_OP_MAPPING
from google.protobuf import json_format

register_extension_yaml(sys.argv[2], uri="extension:org.fsdatalab.quail_b:functions_ai")
from ibis_substrait.compiler.mapping import _extension_mapping
for n in ["ai_filter", "ai_join", "ai_classify"]:
    for k, v in list(_extension_mapping[n].items()):
        _extension_mapping[n][tuple("str" if t == "string" else t for t in k)] = v

docs = ibis.table([("id", "string"), ("body", "string"), ("year", "int64")], name="docs")
topics = ibis.table([("id", "string"), ("name", "string")], name="topics")

@ibis.udf.scalar.builtin
def ai_filter(template: str, doc: str) -> bool:
    ...

@ibis.udf.scalar.builtin
def ai_join(template: str, left: str, right: str) -> bool:
    ...

IBIS_SUBSTRAIT_OP_MAPPING[type(ai_filter("x", docs.body).op()).__name__] = "ai_filter"
IBIS_SUBSTRAIT_OP_MAPPING[type(ai_join("x", docs.body, topics.name).op()).__name__] = "ai_join"

filt = docs.filter([docs.year > 2017, ai_filter("Is the review {0} kind?", docs.body)]).select("id", "year").order_by("id")
# ibis-substrait 4.0.1 drops a projection straight over a join (the root then
# names 2 of the join's 5 columns); a filter in between keeps it.
j = (
    docs.join(topics, ai_join("Is {0} about {1}?", docs.body, topics.name))
    .filter(docs.year > 2016)
    .select("id", "id_right")
)
agg = docs.filter(ai_filter("Is {0} long?", docs.body)).group_by("year").aggregate(n=docs.id.count()).order_by("year")
for name, expr in [("filter", filt), ("join", j), ("aggregate", agg)]:
    plan = SubstraitCompiler().compile(expr)
    open(f"{sys.argv[1]}/ibis-{name}.json", "w").write(json_format.MessageToJson(plan))

