//! A Substrait read's filter, applied. The Substrait spec says a `ReadRel`'s
//! `filter` must hold for every row the read returns; DataFusion's consumer hands
//! it to the table scan only as a pushdown hint (`TableScan::filters`), which an
//! in-memory table ignores, so the plan would return every row. Right after a
//! plan is consumed, each scan's filters become a `Filter` above it (the
//! optimizer pushes them back down where a table can apply them exactly).

use datafusion::common::tree_node::Transformed;
use datafusion::logical_expr::utils::conjunction;
use datafusion::logical_expr::{Expr, LogicalPlan, LogicalPlanBuilder};

use crate::error::Result;

/// `plan` with every table scan's filters applied by a `Filter` above the scan,
/// the scan's projection and fetch kept above it.
pub fn apply_read_filters(plan: LogicalPlan) -> Result<LogicalPlan> {
    let applied = plan.transform_up_with_subqueries(|p| match p {
        LogicalPlan::TableScan(scan) if !scan.filters.is_empty() => {
            let predicate = conjunction(scan.filters.clone()).expect("filters are not empty");
            let columns: Vec<Expr> = scan
                .projected_schema
                .columns()
                .into_iter()
                .map(Expr::Column)
                .collect();
            let mut builder =
                LogicalPlanBuilder::scan(scan.table_name.clone(), scan.source.clone(), None)?
                    .filter(predicate)?;
            if let Some(fetch) = scan.fetch {
                builder = builder.limit(0, Some(fetch))?;
            }
            Ok(Transformed::yes(builder.project(columns)?.build()?))
        }
        other => Ok(Transformed::no(other)),
    })?;
    Ok(applied.data)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion_substrait::substrait::proto::rel::RelType;
    use datafusion_substrait::substrait::proto::{Plan, Rel, plan_rel};

    use crate::inference::backend::NoAnswers;
    use crate::sql::options::QueryOptions;
    use crate::sql::{Evaluation, SqlSession, row_lines};

    async fn session() -> (SqlSession, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let csv = dir.path().join("nation.csv");
        let mut text = String::from("n_nationkey,n_name,n_regionkey\n");
        for k in 0..25 {
            text.push_str(&format!("{k},nation{k},{}\n", k % 5));
        }
        std::fs::write(&csv, text).unwrap();
        let s = SqlSession::new(
            Arc::new(NoAnswers),
            QueryOptions::default(),
            Evaluation::Operators,
        )
        .unwrap();
        s.register("nation", &csv).await.unwrap();
        (s, dir)
    }

    /// The root relation of `plan`.
    fn root(plan: &mut Plan) -> &mut Rel {
        match plan.relations[0].rel_type.as_mut().unwrap() {
            plan_rel::RelType::Root(r) => r.input.as_mut().unwrap(),
            plan_rel::RelType::Rel(r) => r,
        }
    }

    /// Moves the condition of the filter right above a read under `rel` into
    /// the read's own filter, as other producers write it; returns whether
    /// there was one.
    fn into_read(rel: &mut Rel) -> bool {
        let inner = match rel.rel_type.as_mut().unwrap() {
            RelType::Filter(f)
                if matches!(f.input.as_ref().unwrap().rel_type, Some(RelType::Read(_))) =>
            {
                let mut read = *f.input.take().unwrap();
                let Some(RelType::Read(r)) = read.rel_type.as_mut() else {
                    unreachable!()
                };
                r.filter = f.condition.take();
                read
            }
            RelType::Project(p) => return into_read(p.input.as_mut().unwrap()),
            RelType::Fetch(f) => return into_read(f.input.as_mut().unwrap()),
            RelType::Filter(f) => return into_read(f.input.as_mut().unwrap()),
            _ => return false,
        };
        *rel = inner;
        true
    }

    #[tokio::test]
    async fn a_read_filter_keeps_only_its_rows_with_any_projection_and_fetch() {
        let (s, _dir) = session().await;
        for (sql, want) in [
            ("SELECT * FROM nation WHERE n_regionkey = 2", 5),
            ("SELECT n_nationkey FROM nation WHERE n_regionkey = 2", 5),
            (
                "SELECT n_nationkey FROM nation WHERE n_regionkey = 2 LIMIT 3",
                3,
            ),
        ] {
            let mut plan = s.to_substrait(sql).await.unwrap();
            assert!(into_read(root(&mut plan)), "{sql}: no filter over a read");
            let planned = s.plan_substrait(&plan).await.unwrap();
            let out = s
                .run_plan(planned, std::time::Instant::now())
                .await
                .unwrap();
            let rows = row_lines(&out.batches).unwrap();
            assert_eq!(rows.len(), want, "{sql}: {rows:?}");
            // Nation k is in region k % 5.
            for row in &rows {
                let key: u32 = row.split(" | ").next().unwrap().parse().unwrap();
                assert_eq!(key % 5, 2, "{sql}: {rows:?}");
            }
        }
    }
}
