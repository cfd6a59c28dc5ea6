#!/usr/bin/env bash
# Installs the tools the tests check aisql against that nobody here wrote, from
# PyPI into one virtual environment: substrait-validator (every plan that
# `aisql sql --to-substrait` writes must pass it). The tests find the
# environment at $AISQL_TEST_VENV, by default ~/.cache/aisql-test-venv;
# .ci/run calls this script. Needs python3 with venv (Debian: python3-venv).
set -euo pipefail
venv="${AISQL_TEST_VENV:-$HOME/.cache/aisql-test-venv}"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv" || {
        echo "test-tools: python3 -m venv failed; install python3-venv (apt-get install python3-venv)" >&2
        exit 1
    }
fi
"$venv/bin/pip" install --quiet --disable-pip-version-check substrait-validator==0.1.4
echo "test-tools: $venv ($("$venv/bin/python" -c 'import substrait_validator as v; print("substrait-validator", v.version())'))"
