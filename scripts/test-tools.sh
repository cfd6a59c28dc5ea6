#!/usr/bin/env bash
# Installs the tools the tests check aisql against that nobody here wrote, from
# PyPI into one virtual environment: substrait-validator (every plan that
# `aisql sql --to-substrait` writes must pass it), numpy (the independent
# Qwen3 forward of tests/reference/qwen3_numpy.py that `aisql model generate`
# must agree with), gguf (llama.cpp's own GGUF reader, which dequantizes a Q8_0
# file's blocks for that reference), psycopg (a PostgreSQL client for `aisql serve`; the other,
# psql, is Debian's postgresql-client, which .ci/run installs), and maturin,
# pytest, pandas and pyarrow (tests/python_package.rs builds the Python package
# in python/ with maturin and runs its pytest suite).
# The tests find the environment at $AISQL_TEST_VENV, by default
# ~/.cache/aisql-test-venv; .ci/run calls this script. Needs python3
# (3.11 or later, for numpy 2.4) with venv (Debian: python3-venv).
set -euo pipefail
venv="${AISQL_TEST_VENV:-$HOME/.cache/aisql-test-venv}"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv" || {
        echo "test-tools: python3 -m venv failed; install python3-venv (apt-get install python3-venv)" >&2
        exit 1
    }
fi
"$venv/bin/pip" install --quiet --disable-pip-version-check substrait-validator==0.1.4 numpy==2.4.6 \
    gguf==0.19.0 "psycopg[binary]==3.3.9" maturin==1.16.0 pytest==9.2.0 pandas==3.1.1 pyarrow==26.0.1
echo "test-tools: $venv ($("$venv/bin/python" -c 'import gguf, numpy, pandas, psycopg, pyarrow, pytest, substrait_validator as v; from importlib.metadata import version; print("substrait-validator", v.version(), "numpy", numpy.__version__, "gguf", version("gguf"), "psycopg", psycopg.__version__, "pandas", pandas.__version__, "pyarrow", pyarrow.__version__, "pytest", pytest.__version__)'))"
