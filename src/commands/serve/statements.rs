//! The statements of `aisql serve`'s clients. datafusion-postgres reads them
//! (its PostgreSQL parser, parameter decoding, `SET`/`SHOW` of client
//! settings, `BEGIN`/`COMMIT`); every other statement runs in the
//! connection's own [`SqlSession`] on the one model, under the engine's
//! read-only rule, and its rows are encoded by arrow-pg.

use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::DataType;
use datafusion::common::ParamValues;
use datafusion::logical_expr::LogicalPlan;
use datafusion::prelude::SessionContext;
use datafusion::sql::sqlparser::ast::Statement;
use datafusion_postgres::arrow_pg::datatypes::df::deserialize_parameters;
use datafusion_postgres::arrow_pg::datatypes::{arrow_schema_to_pg_fields, encode_recordbatch};
use datafusion_postgres::datafusion_pg_catalog::pg_catalog::context::EmptyContextProvider;
use datafusion_postgres::datafusion_pg_catalog::pg_catalog::setup_pg_catalog;
use datafusion_postgres::hooks::set_show::SetShowHook;
use datafusion_postgres::hooks::transactions::TransactionStatementHook;
use datafusion_postgres::hooks::{HookClient, QueryHook};
use datafusion_postgres::{DfSessionService, Parser};
use futures::Sink;
use pgwire::api::auth::StartupHandler;
use pgwire::api::cancel::{CancelHandler, DefaultCancelHandler};
use pgwire::api::portal::{Format, Portal};
use pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler};
use pgwire::api::results::{QueryResponse, Response};
use pgwire::api::store::PortalStore;
use pgwire::api::{ClientInfo, ClientPortalStore, ConnectionManager, PgWireServerHandlers};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::PgWireBackendMessage;
use pgwire::types::format::FormatOptions;

use super::auth::{Startup, Verifier};
use crate::commands::connect::Connection;
use aisql_engine::sql::{SqlOutput, SqlSession};

/// The catalog every session's tables are in, as PostgreSQL clients see it.
const CATALOG: &str = "datafusion";

/// Everything one server's connections share.
pub struct Handlers {
    statements: Arc<Statements>,
    verifier: Option<Arc<Verifier>>,
    connections: Arc<ConnectionManager>,
}

impl Handlers {
    /// The handlers of a server over `connection`, asking clients for the
    /// password of `verifier` if any.
    pub fn new(connection: Arc<Connection>, verifier: Option<Verifier>) -> anyhow::Result<Self> {
        let engine = Arc::new(EngineStatements {
            connection: connection.clone(),
        });
        // datafusion-postgres's own context holds no table: the statements it
        // answers (client settings, transactions) read none.
        let settings = SessionContext::new();
        setup_pg_catalog(&settings, CATALOG, EmptyContextProvider)
            .map_err(|e| anyhow::anyhow!("setting up pg_catalog: {e}"))?;
        let hooks: Vec<Arc<dyn QueryHook>> = vec![
            engine.clone(),
            Arc::new(SetShowHook),
            Arc::new(TransactionStatementHook),
        ];
        Ok(Self {
            statements: Arc::new(Statements {
                front: Arc::new(DfSessionService::new_with_hooks(Arc::new(settings), hooks)),
                engine,
            }),
            verifier: verifier.map(Arc::new),
            connections: Arc::new(ConnectionManager::new()),
        })
    }

    /// Whether clients must give a password.
    pub fn needs_password(&self) -> bool {
        self.verifier.is_some()
    }
}

impl PgWireServerHandlers for Handlers {
    fn simple_query_handler(&self) -> Arc<impl SimpleQueryHandler> {
        self.statements.clone()
    }

    fn extended_query_handler(&self) -> Arc<impl ExtendedQueryHandler> {
        self.statements.clone()
    }

    fn startup_handler(&self) -> Arc<impl StartupHandler> {
        Arc::new(Startup::new(self.verifier.as_ref(), &self.connections))
    }

    fn cancel_handler(&self) -> Arc<impl CancelHandler> {
        Arc::new(DefaultCancelHandler::new(self.connections.clone()))
    }
}

/// Whether datafusion-postgres answers `statement` itself: a client's
/// session settings and transaction bounds, which touch no table.
fn session_statement(statement: &Statement) -> bool {
    matches!(
        statement,
        Statement::Set(_)
            | Statement::ShowVariable { .. }
            | Statement::StartTransaction { .. }
            | Statement::Commit { .. }
            | Statement::Rollback { .. }
    )
}

/// A `SET` of the engine's own settings, which the server fixes at its start
/// for every client: the name of the setting, if `statement` is one.
fn engine_setting(statement: &Statement) -> Option<String> {
    let Statement::Set(_) = statement else {
        return None;
    };
    statement
        .to_string()
        .split([' ', '='])
        .map(|w| w.trim_matches('"').to_ascii_lowercase())
        .find(|w| w.starts_with("datafusion.") || w.starts_with("aisql."))
}

/// The statements the engine runs.
struct EngineStatements {
    connection: Arc<Connection>,
}

impl EngineStatements {
    /// The client's session, made at its first statement: its own catalog
    /// (with pg_catalog) over the server's tables.
    async fn session_of(
        &self,
        client: &(dyn ClientInfo + Send + Sync),
    ) -> PgWireResult<Arc<SqlSession>> {
        let extensions = client.session_extensions();
        if let Some(session) = extensions.get::<SqlSession>() {
            return Ok(session);
        }
        let session = self.connection.new_session().await.map_err(user_error)?;
        setup_pg_catalog(session.context(), CATALOG, EmptyContextProvider)
            .map_err(|e| user_error(anyhow::anyhow!("setting up pg_catalog: {e}")))?;
        extensions.insert(session);
        extensions
            .get::<SqlSession>()
            .ok_or_else(|| user_error(anyhow::anyhow!("the session was lost (a bug in aisql)")))
    }
}

#[async_trait]
impl QueryHook for EngineStatements {
    async fn handle_simple_query(
        &self,
        statement: &Statement,
        _settings: &SessionContext,
        client: &mut dyn HookClient,
    ) -> Option<PgWireResult<Response>> {
        if let Some(setting) = engine_setting(statement) {
            return Some(Err(refused_setting(&setting)));
        }
        if session_statement(statement) {
            return None;
        }
        let run = async {
            let session = self.session_of(&*client).await?;
            let out = self
                .connection
                .run(&session, &statement.to_string())
                .await
                .map_err(user_error)?;
            rows_response(out, &Format::UnifiedText, client.metadata())
        };
        Some(run.await)
    }

    async fn handle_extended_parse_query(
        &self,
        statement: &Statement,
        _settings: &SessionContext,
        client: &(dyn ClientInfo + Send + Sync),
    ) -> Option<PgWireResult<LogicalPlan>> {
        if let Some(setting) = engine_setting(statement) {
            return Some(Err(refused_setting(&setting)));
        }
        if session_statement(statement) {
            return None;
        }
        let prepare = async {
            let session = self.session_of(client).await?;
            session
                .prepare(&statement.to_string())
                .await
                .map_err(|e| user_error(e.into()))
        };
        Some(prepare.await)
    }

    async fn handle_extended_query(
        &self,
        _statement: &Statement,
        _plan: &LogicalPlan,
        _params: &ParamValues,
        _settings: &SessionContext,
        _client: &mut dyn HookClient,
    ) -> Option<PgWireResult<Response>> {
        // Bound statements run in `Statements::do_query`, which knows the
        // result formats the client asked for.
        None
    }
}

/// The query handlers: datafusion-postgres's front, the engine behind it.
struct Statements {
    front: Arc<DfSessionService>,
    engine: Arc<EngineStatements>,
}

#[async_trait]
impl SimpleQueryHandler for Statements {
    async fn do_query<C>(&self, client: &mut C, query: &str) -> PgWireResult<Vec<Response>>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        SimpleQueryHandler::do_query(&*self.front, client, query).await
    }
}

#[async_trait]
impl ExtendedQueryHandler for Statements {
    type Statement = <DfSessionService as ExtendedQueryHandler>::Statement;
    type QueryParser = Parser;

    fn query_parser(&self) -> Arc<Self::QueryParser> {
        self.front.query_parser()
    }

    async fn do_query<C>(
        &self,
        client: &mut C,
        portal: &Portal<Self::Statement>,
        max_rows: usize,
    ) -> PgWireResult<Response>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let (sql, parsed) = &portal.statement.statement;
        let Some((statement, plan)) = parsed else {
            return Ok(Response::EmptyQuery);
        };
        if session_statement(statement) {
            return ExtendedQueryHandler::do_query(&*self.front, client, portal, max_rows).await;
        }
        let types = parameter_types(plan).map_err(user_error)?;
        let type_refs: Vec<Option<&DataType>> = types.iter().map(Option::as_ref).collect();
        let params = deserialize_parameters(portal, &type_refs)?;
        let session = self.engine.session_of(&*client).await?;
        let out = self
            .engine
            .connection
            .run_with_params(&session, sql, params)
            .await
            .map_err(user_error)?;
        rows_response(out, &portal.result_column_format, client.metadata())
    }
}

/// The types of `plan`'s placeholders `$1`, `$2`, ..., in order (`None`
/// where the planner could not tell).
fn parameter_types(plan: &LogicalPlan) -> anyhow::Result<Vec<Option<DataType>>> {
    let mut types: Vec<(usize, Option<DataType>)> = plan
        .get_parameter_types()?
        .into_iter()
        .map(|(name, ty)| {
            name.trim_start_matches('$')
                .parse::<usize>()
                .map(|n| (n, ty))
                .map_err(|_| anyhow::anyhow!("parameter {name}: expected $1, $2, ..."))
        })
        .collect::<anyhow::Result<_>>()?;
    types.sort_by_key(|(n, _)| *n);
    Ok(types.into_iter().map(|(_, ty)| ty).collect())
}

/// A statement's rows as PostgreSQL rows, in `format` (text or binary per
/// column, as the client asked).
fn rows_response(
    out: SqlOutput,
    format: &Format,
    metadata: &std::collections::HashMap<String, String>,
) -> PgWireResult<Response> {
    let options = Arc::new(FormatOptions::from_client_metadata(metadata));
    let fields = Arc::new(arrow_schema_to_pg_fields(
        &out.schema,
        format,
        Some(options),
    )?);
    let rows_fields = fields.clone();
    let rows = out
        .batches
        .into_iter()
        .flat_map(move |batch| encode_recordbatch(rows_fields.clone(), batch));
    Ok(Response::Query(QueryResponse::new(
        fields,
        futures::stream::iter(rows),
    )))
}

/// An engine error as the client sees it: PostgreSQL's ERROR with the whole
/// message.
fn user_error(e: anyhow::Error) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "ERROR".into(),
        "XX000".into(),
        format!("{e:#}"),
    )))
}

/// The refusal of a `SET` of an engine setting.
fn refused_setting(setting: &str) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "ERROR".into(),
        // read_only_sql_transaction
        "25006".into(),
        format!(
            "SET {setting}: aisql serve is read-only; its engine settings are fixed when it \
             starts (restart it with other flags)"
        ),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
    use datafusion::sql::sqlparser::parser::Parser as SqlParser;

    fn statement(sql: &str) -> Statement {
        SqlParser::parse_sql(&PostgreSqlDialect {}, sql)
            .unwrap()
            .remove(0)
    }

    #[test]
    fn client_settings_pass_engine_settings_are_refused() {
        assert!(session_statement(&statement(
            "SET application_name = 'psql'"
        )));
        assert_eq!(
            engine_setting(&statement("SET application_name = 'psql'")),
            None
        );
        assert_eq!(
            engine_setting(&statement("SET datafusion.execution.batch_size = 1")).as_deref(),
            Some("datafusion.execution.batch_size")
        );
        assert!(session_statement(&statement("BEGIN")));
        assert!(session_statement(&statement("SHOW DateStyle")));
        assert!(!session_statement(&statement("SELECT 1")));
        assert!(!session_statement(&statement("COPY t TO '/tmp/x.csv'")));
    }

    #[test]
    fn parameter_types_come_in_placeholder_order() {
        let ctx = SessionContext::new();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let plan = rt
            .block_on(ctx.state().create_logical_plan(
                "SELECT * FROM (VALUES (1, 'a')) t(n, s) WHERE s = $2 AND n = $1",
            ))
            .unwrap();
        let types = parameter_types(&plan).unwrap();
        assert_eq!(types, vec![Some(DataType::Int64), Some(DataType::Utf8)]);
    }
}
