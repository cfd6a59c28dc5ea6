"""The Python package against the `aisql` command line (``$AISQL_BIN``), on the
tiny generated Qwen3: the same statement over the same rows gives the same
answers, whichever way the rows come in (a pandas frame, a Parquet path)."""

import _thread
import json
import os
import signal
import subprocess
import threading
import time

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import aisql

TEXTS = [
    "The food was wonderful and the staff were kind.",
    "Terrible service, cold soup, never again.",
    "An average evening, nothing special.",
    "I loved every minute of the concert!",
    "The battery died after two days.",
    "Great value for the price, would buy again.",
    "The hotel room smelled of smoke.",
    "Fast delivery and the package was intact.",
]

FILTER = "SELECT id, text FROM docs WHERE ai_filter('Is {0} positive?', text) ORDER BY id"
CLASSIFY = (
    "SELECT id, ai_classify('Tone of {0}?', text, ['pos', 'neg'], ['Good', 'Bad']) AS tone "
    "FROM docs ORDER BY id"
)


@pytest.fixture(scope="module")
def frame():
    return pd.DataFrame({"id": range(len(TEXTS)), "text": TEXTS})


@pytest.fixture(scope="module")
def parquet(frame, tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "docs.parquet"
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path)
    return path


@pytest.fixture(scope="module")
def con():
    return aisql.connect(model="tiny", device="cpu")


def cli_rows(sql, tables):
    """The rows `aisql sql --format json` prints for `sql` over `tables`."""
    binary = os.environ["AISQL_BIN"]
    args = [binary, "sql", sql, "--model", "tiny", "--format", "json", "--progress", "off"]
    for name, path in tables.items():
        args += ["--table", f"{name}={path}"]
    run = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


@pytest.mark.parametrize("sql", [FILTER, CLASSIFY])
def test_a_frame_answers_as_the_command_line(con, frame, parquet, sql):
    con.register("docs", frame)
    result = con.sql(sql)
    assert result.to_arrow().to_pylist() == cli_rows(sql, {"docs": parquet})
    metrics = result.metrics
    assert metrics["rows"] == len(result)
    assert metrics["ai_operators"] == 1
    assert metrics["seconds"] > 0


def test_a_parquet_path_answers_as_the_command_line(con, parquet):
    con.register("docs", parquet)
    want = cli_rows(FILTER, {"docs": parquet})
    assert con.sql(FILTER).to_pandas().to_dict("records") == want
    # The frame and the path give the same rows.
    assert pa.table(con.sql(FILTER)).to_pylist() == want


def test_tables_given_to_connect(frame, parquet):
    con = aisql.connect(model="tiny", tables={"a": frame, "b": str(parquet)}, progress="off")
    got = con.sql("SELECT count(*) AS n FROM a JOIN b ON a.id = b.id").to_arrow()
    assert got.to_pylist() == [{"n": len(TEXTS)}]


def test_explain_shows_the_ai_filter(con, frame):
    con.register("docs", frame)
    plan = con.sql(FILTER).explain()
    assert "logical_plan" in plan and "physical_plan" in plan, plan
    assert "Is {0} positive?" in plan, plan
    analyzed = con.sql(FILTER).explain(analyze=True)
    assert "output_rows" in analyzed, analyzed


@pytest.fixture
def ctrl_c_raises():
    """Ctrl-C raises KeyboardInterrupt, whatever the runner's shell left: a
    Python started with SIGINT ignored (a background job of a
    non-interactive shell) keeps it ignored, and then `interrupt_main` does
    nothing."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_ctrl_c_stops_a_query_and_the_connection_goes_on(ctrl_c_raises):
    # A time limit far past the test's own bound: a Ctrl-C that is lost makes
    # the test fail in minutes, not run a million rows.
    con = aisql.connect(model="tiny", device="cpu", timeout_s=120)
    # A million distinct texts: far more model work than the second it runs.
    long = (
        "SELECT count(*) FROM (SELECT 'review number ' || value AS t "
        "FROM generate_series(1, 1000000)) WHERE ai_filter('Is {0} positive?', t)"
    )
    timer = threading.Timer(1.0, _thread.interrupt_main)
    started = time.monotonic()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        con.sql(long).to_arrow()
    stopped = time.monotonic() - started
    assert stopped < 30, f"Ctrl-C took {stopped:.1f}s to stop the query"
    # The model is free again: the next AI query runs, and asks it.
    con.register("small", pa.table({"t": ["fine", "bad"]}))
    again = con.sql("SELECT t, ai_filter('Is {0} positive?', t) AS yes FROM small ORDER BY t")
    assert [r["t"] for r in again.to_arrow().to_pylist()] == ["bad", "fine"]
    assert again.metrics["fresh_tokens"] > 0


def test_a_bad_statement_raises_the_engine_error(con):
    with pytest.raises(aisql.Error, match="no_such_table"):
        con.sql("SELECT * FROM no_such_table").to_arrow()
    with pytest.raises(aisql.Error) as bad:
        con.sql("SELEC 1").to_arrow()
    assert "SELEC" in str(bad.value)
    assert issubclass(aisql.Error, Exception)


def test_statements_are_read_only_unless_allowed(frame):
    con = aisql.connect(model="tiny", tables={"docs": frame})
    with pytest.raises(aisql.Error, match="allow_writes|--allow-writes|read-only"):
        con.execute("CREATE VIEW v AS SELECT id FROM docs")
    writer = aisql.connect(model="tiny", tables={"docs": frame}, allow_writes=True)
    writer.execute("CREATE VIEW v AS SELECT id FROM docs WHERE id < 3")
    assert writer.sql("SELECT count(*) AS n FROM v").to_arrow().to_pylist() == [{"n": 3}]


def test_no_statement_writes_over_a_registered_path(parquet):
    writer = aisql.connect(model="tiny", allow_writes=True)
    writer.register("docs", parquet)
    before = parquet.read_bytes()
    with pytest.raises(aisql.Error, match="docs"):
        writer.execute(f"COPY (SELECT 1 AS x) TO '{parquet}'")
    assert parquet.read_bytes() == before


def test_bad_keywords_and_values_raise():
    with pytest.raises(TypeError, match="no_such_option"):
        aisql.connect(model="tiny", no_such_option=1)
    with pytest.raises(ValueError, match="soon"):
        aisql.connect(model="tiny", timeout_s="soon")
    # A value is never read as a flag.
    with pytest.raises(aisql.Error, match="--allow-writes"):
        aisql.connect(model="--allow-writes")
    with pytest.raises(ValueError, match="cuda:N"):
        aisql.connect(model="tiny", device="tpu")
    # The keywords set the typed fields: the flags' parsers and rules, with
    # the option named as a keyword.
    with pytest.raises(TypeError, match="the keywords are .*max_fresh_tokens"):
        aisql.connect(model="tiny", no_such_option=1)
    with pytest.raises(TypeError, match="use device="):
        aisql.connect(model="tiny", gpu=0)
    with pytest.raises(
        ValueError, match="^invalid value 'soon' for 'timeout_s': \"soon\" is not a number of seconds$"
    ):
        aisql.connect(model="tiny", timeout_s="soon")
    with pytest.raises(ValueError, match="^invalid value '0' for 'max_fresh_tokens'"):
        aisql.connect(model="tiny", max_fresh_tokens=0)
    with pytest.raises(ValueError, match="^on_budget needs a budget to act on: give max_fresh_tokens"):
        aisql.connect(model="tiny", on_budget="partial")
    with pytest.raises(ValueError, match="possible values: fail, partial"):
        aisql.connect(model="tiny", max_fresh_tokens=9, on_budget="some")
    with pytest.raises(ValueError, match="^workers cannot be used with device"):
        aisql.connect(model="tiny", device="cuda:0", workers=["127.0.0.1:1"])
    with pytest.raises(ValueError, match="^worker_token_file is for remote workers: give workers too"):
        aisql.connect(model="tiny", worker_token_file="t")
    with pytest.raises(ValueError, match="'simulate': expected True or False"):
        aisql.connect(model="tiny", simulate="yes")
    with pytest.raises(ValueError, match=r"^max_fresh_tokens: backend=\"oracle\" answers"):
        aisql.connect(backend="oracle", max_fresh_tokens=9)
    with pytest.raises(TypeError, match="expected a path"):
        aisql.connect(model="tiny").register("t", 42)
    with pytest.raises(aisql.Error, match="no_such_file"):
        aisql.connect(model="tiny").register("t", "/no_such_file.parquet")


def test_options_reach_the_engine(frame):
    # A budget of one fresh token cannot answer eight rows.
    con = aisql.connect(model="tiny", tables={"docs": frame}, max_fresh_tokens=1)
    with pytest.raises(aisql.Error, match="max-fresh-tokens|budget"):
        con.sql(FILTER).to_arrow()


def test_typed_fields_arrive_with_their_arrow_types(con, frame):
    """`ai_extract`'s typed fields and `ai_generate` come to Python as their
    Arrow types, every row a value (the grammar makes each answer parse)."""
    con.register("docs", frame)
    got = con.sql(
        "SELECT id, ai_extract(text, ['year INT: Which year?', 'on DATE: When?', "
        "'good BOOLEAN: Is it good?', 'tone ENUM(warm, cold): Tone?'], 24) AS f, "
        "ai_generate('DOUBLE', 'Rate {0} out of ten.', text, 24) AS rating "
        "FROM docs ORDER BY id"
    ).to_arrow()
    assert got.schema.field("f").type == pa.struct(
        [("year", pa.int64()), ("on", pa.date32()), ("good", pa.bool_()), ("tone", pa.string())]
    )
    assert got.schema.field("rating").type == pa.float64()
    fields = got.column("f").combine_chunks()
    for name in ["year", "on", "good", "tone"]:
        assert fields.field(name).null_count == 0, name
    assert set(fields.field("tone").to_pylist()) <= {"warm", "cold"}
