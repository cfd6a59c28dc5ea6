"""aisql: AI-SQL (``ai_filter``, ``ai_classify``, ``ai_join``) on a local Qwen3.

    import aisql
    con = aisql.connect(model="tiny")
    con.register("reviews", "reviews.parquet")
    con.sql("SELECT id FROM reviews WHERE ai_filter('Is {0} positive?', body)").to_pandas()

``connect`` takes the flags of ``aisql sql`` as keywords (``backend="oracle"``,
``max_fresh_tokens=1000``, ``timeout_s=5``, ...); statements are read-only
unless ``allow_writes=True``. Ctrl-C stops a running statement and its model
work; the connection stays usable. Failures raise :class:`aisql.Error`.
"""

from ._aisql import Connection, Error, Relation, connect

__all__ = ["Connection", "Error", "Relation", "connect"]
