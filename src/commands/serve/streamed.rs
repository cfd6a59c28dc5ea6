//! A statement's rows on their way to its client. The query runs as a task
//! of its own and hands its batches over a channel of [`IN_FLIGHT_BATCHES`]
//! ([`ChannelRows`]): the server holds a bounded part of any result, never
//! the whole of it, and a client that stops reading (or goes away) stops the
//! query. A result of at most [`HELD_BYTES`] waits for its statement's end,
//! so that the statement's NOTICE (what the model computed) comes before its
//! rows, as psql prints it; a larger one is sent as it comes, and its NOTICE
//! is left out, since PostgreSQL's protocol has no place for it after the
//! rows began.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::array::RecordBatch;
use datafusion::logical_expr::LogicalPlan;
use datafusion_postgres::arrow_pg::datatypes::{arrow_schema_to_pg_fields, encode_recordbatch};
use futures::StreamExt;
use pgwire::api::portal::Format;
use pgwire::api::results::{QueryResponse, Response};
use pgwire::error::{PgWireError, PgWireResult};
use pgwire::messages::PgWireBackendMessage;
use pgwire::types::format::FormatOptions;

use super::statements::{user_error, work_notice};
use crate::commands::connect::Connection;
use aisql_engine::data::row_sink::ChannelRows;
use aisql_engine::sql::SqlSession;

/// Batches a statement may have made ahead of its client's reading.
const IN_FLIGHT_BATCHES: usize = 2;

/// Result bytes (Arrow memory) held back for the statement's NOTICE.
const HELD_BYTES: usize = 4 << 20;

/// What a statement sends its client: the NOTICE of its work, where there
/// is one to send before the rows, and its rows.
pub struct Sent {
    pub notice: Option<PgWireBackendMessage>,
    pub response: Response,
}

/// Runs `plan` on `session`, its rows sent in `format` as they come (see the
/// module's header).
pub async fn run(
    connection: &Arc<Connection>,
    session: Arc<SqlSession>,
    plan: LogicalPlan,
    statement_timeout: Option<Duration>,
    format: &Format,
    metadata: &HashMap<String, String>,
) -> PgWireResult<Sent> {
    let schema = Arc::new(plan.schema().as_arrow().clone());
    let options = Arc::new(FormatOptions::from_client_metadata(metadata));
    let fields = Arc::new(arrow_schema_to_pg_fields(&schema, format, Some(options))?);
    let (sink, mut rows) = ChannelRows::channel(IN_FLIGHT_BATCHES);
    let mut query = connection.spawn_into(session, plan, statement_timeout, sink);
    let mut held: Vec<RecordBatch> = Vec::new();
    let mut held_bytes = 0usize;
    while held_bytes <= HELD_BYTES {
        match rows.recv().await {
            Some(batch) => {
                held_bytes += batch.get_array_memory_size();
                held.push(batch);
            }
            // Every sender is gone: the statement ended.
            None => {
                let out = finished(&mut query).await?;
                let encode_fields = fields.clone();
                let encoded = held
                    .into_iter()
                    .flat_map(move |batch| encode_recordbatch(encode_fields.clone(), batch));
                return Ok(Sent {
                    notice: work_notice(&out),
                    response: Response::Query(QueryResponse::new(
                        fields,
                        futures::stream::iter(encoded),
                    )),
                });
            }
        }
    }
    // Past what is held: the rows held, then the rest as the query makes
    // them, then its error if it fails on the way.
    let rest = futures::stream::unfold(rows, |mut rows| async move {
        rows.recv().await.map(|batch| (batch, rows))
    });
    let batches = futures::stream::iter(held).chain(rest);
    let encode_fields = fields.clone();
    let encoded = batches.flat_map(move |batch| {
        futures::stream::iter(encode_recordbatch(encode_fields.clone(), batch))
    });
    let failure = futures::stream::once(async move { finished(&mut query).await.err() })
        .filter_map(|e| async move { e.map(Err) });
    Ok(Sent {
        notice: None,
        response: Response::Query(QueryResponse::new(fields, encoded.chain(failure))),
    })
}

/// The statement's output once its task has ended.
async fn finished(
    query: &mut tokio::task::JoinHandle<anyhow::Result<aisql_engine::sql::SqlOutput>>,
) -> PgWireResult<aisql_engine::sql::SqlOutput> {
    match query.await {
        Ok(out) => out.map_err(user_error),
        Err(e) => Err(PgWireError::ApiError(Box::new(e))),
    }
}
