"""Checks Substrait plan files (binary, or ProtoJSON when named .json) with
substrait-validator in its CLI's default (loose) mode: a plan fails when the
validator proves it invalid. ProtoJSON is read with the validator's own
(pre-0.75) definitions, skipping the keys they do not know, as a tolerant
reader of that generation does: only the extension URIs declare extensions
to it.
Prints one line per failing plan with the validator's errors and exits 1 if
any failed. Used by tests/sql_differential.rs."""

import sys

import substrait_validator as sv
from google.protobuf import json_format


def errors(data: bytes) -> list[str]:
    result = sv.plan_to_result_handle(data)
    if sv.check_plan(result) >= 0:
        return []
    return [
        f"{sv.path_to_string(d.path)}: {d.msg}"
        for d in sv.plan_to_diagnostics(result)
        if d.adjusted_level >= sv.Diagnostic.Level.LEVEL_ERROR
    ]


failed = 0
for path in sys.argv[1:]:
    with open(path, "rb") as f:
        data = f.read()
    if path.endswith(".json"):
        plan = json_format.Parse(data.decode(), sv.Plan(), ignore_unknown_fields=True)
        data = plan.SerializeToString()
    found = errors(data)
    if found:
        failed += 1
        print(f"{path}: " + "; ".join(found[:5]))
print(f"{len(sys.argv) - 1 - failed} of {len(sys.argv) - 1} plans valid")
sys.exit(1 if failed else 0)
