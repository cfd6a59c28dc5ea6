//! The statements of `aisql serve`'s clients. datafusion-postgres reads them
//! (its PostgreSQL parser, parameter decoding, `SET`/`SHOW` of client
//! settings, `BEGIN`/`COMMIT`); every other statement runs in the
//! connection's own [`SqlSession`] on the one model, under the engine's
//! read-only rule, and its rows are encoded by arrow-pg.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use datafusion::arrow::datatypes::DataType;
use datafusion::common::ParamValues;
use datafusion::logical_expr::LogicalPlan;
use datafusion::prelude::SessionContext;
use datafusion::sql::sqlparser::ast::Statement;
use datafusion_postgres::arrow_pg::datatypes::df::deserialize_parameters;
use datafusion_postgres::datafusion_pg_catalog::pg_catalog::context::EmptyContextProvider;
use datafusion_postgres::datafusion_pg_catalog::pg_catalog::setup_pg_catalog;
use datafusion_postgres::hooks::set_show::SetShowHook;
use datafusion_postgres::hooks::transactions::TransactionStatementHook;
use datafusion_postgres::hooks::{HookClient, QueryHook};
use datafusion_postgres::{DfSessionService, Parser};
use futures::Sink;
use pgwire::api::Type;
use pgwire::api::auth::StartupHandler;
use pgwire::api::cancel::{CancelHandler, DefaultCancelHandler};
use pgwire::api::portal::{Format, Portal};
use pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler};
use pgwire::api::results::{FieldInfo, Response, Tag};
use pgwire::api::stmt::QueryParser;
use pgwire::api::store::PortalStore;
use pgwire::api::{ClientInfo, ClientPortalStore, ConnectionManager, PgWireServerHandlers};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::PgWireBackendMessage;

use super::auth::{Startup, Verifier};
use super::streamed;
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

/// The variable a `SET` names, unquoted and in lower case
/// (`"DataFusion"."execution".x` is `datafusion.execution.x`), if
/// `statement` is one.
fn set_variable(statement: &Statement) -> Option<String> {
    let Statement::Set(_) = statement else {
        return None;
    };
    let text = statement.to_string();
    let mut rest = text.trim_start();
    rest = rest.get(3..)?.trim_start();
    for scope in ["session ", "local "] {
        if rest
            .get(..scope.len())
            .is_some_and(|word| word.eq_ignore_ascii_case(scope))
        {
            rest = rest[scope.len()..].trim_start();
        }
    }
    let mut name = String::new();
    let mut quoted = false;
    for c in rest.chars() {
        match c {
            '"' => quoted = !quoted,
            c if !quoted && (c.is_whitespace() || c == '=') => break,
            c => name.push(c),
        }
    }
    Some(name.to_lowercase())
}

/// A `SET` of the engine's own settings, which the server fixes at its start
/// for every client, in any spelling: the name of the setting, if
/// `statement` is one. PostgreSQL's client settings have no dot in their
/// names; DataFusion's (`datafusion.*`) and aisql's (`aisql.*`) do.
fn engine_setting(statement: &Statement) -> Option<String> {
    let name = set_variable(statement)?;
    (name.contains('.') || name.starts_with("datafusion") || name.starts_with("aisql"))
        .then_some(name)
}

/// The metadata key datafusion-postgres's `SHOW statement_timeout` reads.
const STATEMENT_TIMEOUT_KEY: &str = "statement_timeout_ms";

/// A `SET statement_timeout`'s value: the limit (`None`: no limit, as `0`
/// and `DEFAULT`), or why the value is not one. Units as PostgreSQL's: `us`,
/// `ms` (the default), `s`, `min`, `h`, `d`.
fn statement_timeout_value(statement: &Statement) -> Option<Result<Option<Duration>, String>> {
    if set_variable(statement)? != "statement_timeout" {
        return None;
    }
    let text = statement.to_string();
    let lower = text.to_ascii_lowercase();
    let at = lower.find("statement_timeout")? + "statement_timeout".len();
    let value = text[at..].trim_start_matches(['"', ' ']);
    let value = value
        .strip_prefix('=')
        .or_else(|| {
            value
                .get(..3)
                .filter(|v| v.eq_ignore_ascii_case("to "))
                .map(|_| &value[3..])
        })
        .unwrap_or(value)
        .trim()
        .trim_matches('\'')
        .trim();
    Some(parse_timeout(value))
}

fn parse_timeout(value: &str) -> Result<Option<Duration>, String> {
    let invalid = || {
        format!(
            "invalid value for statement_timeout: {value:?} (a number of milliseconds, or \
             with a unit: us, ms, s, min, h, d)"
        )
    };
    if value.eq_ignore_ascii_case("default") {
        return Ok(None);
    }
    let split = value
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(value.len());
    let (number, unit) = value.split_at(split);
    let number: f64 = number.parse().map_err(|_| invalid())?;
    let millis_per = match unit.trim().to_ascii_lowercase().as_str() {
        "us" => 0.001,
        "" | "ms" => 1.0,
        "s" => 1_000.0,
        "min" => 60_000.0,
        "h" => 3_600_000.0,
        "d" => 86_400_000.0,
        _ => return Err(invalid()),
    };
    let millis = (number * millis_per).round();
    if !millis.is_finite() || millis > i32::MAX as f64 {
        return Err(invalid());
    }
    Ok((millis >= 1.0).then(|| Duration::from_millis(millis as u64)))
}

/// The session's `statement_timeout`, if set.
fn statement_timeout(client: &(impl ClientInfo + ?Sized)) -> Option<Duration> {
    client
        .metadata()
        .get(STATEMENT_TIMEOUT_KEY)
        .and_then(|ms| ms.parse().ok())
        .map(Duration::from_millis)
}

/// The refusal of a statement the server's parser would not read, by its
/// first words: `COPY` (to or from the client, or a file) and `CREATE
/// EXTERNAL TABLE` are refused as the read-only rule refuses them.
fn refused_by_its_words(sql: &str) -> Option<PgWireError> {
    let words: Vec<String> = sql
        .split(|c: char| c.is_whitespace() || c == '(' || c == ';')
        .filter(|w| !w.is_empty())
        .take(3)
        .map(str::to_ascii_lowercase)
        .collect();
    let message = match words.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["copy", ..] => "COPY: aisql's SQL is read-only here: no statement may write or change \
                         the session, and rows go to clients only as query results"
            .to_string(),
        ["create", "external", ..] => "CREATE EXTERNAL TABLE: SQL may not open files; start \
                                       aisql serve with --table NAME=PATH"
            .to_string(),
        _ => return None,
    };
    Some(PgWireError::UserError(Box::new(ErrorInfo::new(
        "ERROR".into(),
        // read_only_sql_transaction
        "25006".into(),
        message,
    ))))
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
        if let Some(session) = extensions.get::<ClientSession>() {
            return Ok(session.0.clone());
        }
        let session = Arc::new(self.connection.new_session().await.map_err(user_error)?);
        // Into the client's extensions first: dropped with them, it takes
        // pg_catalog (and the cycle it makes) out again, even if set-up fails.
        extensions.insert(ClientSession(session.clone()));
        setup_pg_catalog(session.context(), CATALOG, EmptyContextProvider)
            .map_err(|e| user_error(anyhow::anyhow!("setting up pg_catalog: {e}")))?;
        Ok(session)
    }
}

/// A client's session, kept in its connection's extensions. Its pg_catalog
/// schema holds the session's catalog list, which holds the schema: a cycle
/// that would keep every closed connection's catalog (about 5 MB) in memory,
/// so it is broken when the connection goes.
struct ClientSession(Arc<SqlSession>);

impl Drop for ClientSession {
    fn drop(&mut self) {
        if let Some(catalog) = self.0.context().catalog(CATALOG) {
            let _ = catalog.deregister_schema("pg_catalog", true);
        }
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
        if let Some(timeout) = statement_timeout_value(statement) {
            return Some(set_statement_timeout(client, timeout));
        }
        if session_statement(statement) {
            return None;
        }
        let run = async {
            let session = self.session_of(&*client).await?;
            let plan = session
                .plan(&statement.to_string())
                .await
                .map_err(|e| user_error(e.into()))?;
            let sent = streamed::run(
                &self.connection,
                session,
                plan,
                statement_timeout(&*client),
                &Format::UnifiedText,
                client.metadata(),
            )
            .await?;
            if let Some(notice) = sent.notice {
                client.send_message(notice).await?;
            }
            Ok(sent.response)
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
        if let Some(Err(invalid)) = statement_timeout_value(statement) {
            return Some(Err(invalid_value(invalid)));
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
        if let Some(refused) = refused_by_its_words(query) {
            return Err(refused);
        }
        SimpleQueryHandler::do_query(&*self.front, client, query).await
    }
}

#[async_trait]
impl ExtendedQueryHandler for Statements {
    type Statement = <DfSessionService as ExtendedQueryHandler>::Statement;
    type QueryParser = ReadOnlyParser;

    fn query_parser(&self) -> Arc<Self::QueryParser> {
        Arc::new(ReadOnlyParser(self.front.query_parser()))
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
        if let Some(timeout) = statement_timeout_value(statement) {
            return set_statement_timeout(client, timeout);
        }
        if session_statement(statement) {
            return ExtendedQueryHandler::do_query(&*self.front, client, portal, max_rows).await;
        }
        let types = parameter_types(plan).map_err(user_error)?;
        let type_refs: Vec<Option<&DataType>> = types.iter().map(Option::as_ref).collect();
        let params = deserialize_parameters(portal, &type_refs)?;
        check_parameter_casts(plan, &params)?;
        let session = self.engine.session_of(&*client).await?;
        let plan = session
            .plan_with_params(sql, Some(params))
            .await
            .map_err(|e| user_error(e.into()))?;
        let sent = streamed::run(
            &self.engine.connection,
            session,
            plan,
            statement_timeout(&*client),
            &portal.result_column_format,
            client.metadata(),
        )
        .await?;
        if let Some(notice) = sent.notice {
            futures::SinkExt::send(client, notice).await?;
        }
        Ok(sent.response)
    }
}

/// datafusion-postgres's parser behind the read-only refusal: a `Parse`
/// message (psycopg, JDBC: the extended protocol) of a `COPY` or `CREATE
/// EXTERNAL TABLE` is refused as the simple protocol refuses it, not with
/// the parser's error.
struct ReadOnlyParser(Arc<Parser>);

#[async_trait]
impl QueryParser for ReadOnlyParser {
    type Statement = <Parser as QueryParser>::Statement;

    async fn parse_sql<C>(
        &self,
        client: &C,
        sql: &str,
        types: &[Option<Type>],
    ) -> PgWireResult<Option<Self::Statement>>
    where
        C: ClientInfo + Unpin + Send + Sync,
    {
        if let Some(refused) = refused_by_its_words(sql) {
            return Err(refused);
        }
        self.0.parse_sql(client, sql, types).await
    }

    fn get_parameter_types(&self, statement: &Self::Statement) -> PgWireResult<Vec<Type>> {
        self.0.get_parameter_types(statement)
    }

    fn get_result_schema(
        &self,
        statement: &Self::Statement,
        format: Option<&Format>,
    ) -> PgWireResult<Vec<FieldInfo>> {
        self.0.get_result_schema(statement, format)
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

/// Each parameter a statement casts (`$1::int`) must read as the cast's
/// type: one that does not is an error naming the parameter, its value and
/// the type (DataFusion's optimizer would fail folding the cast, naming
/// neither).
fn check_parameter_casts(plan: &LogicalPlan, params: &ParamValues) -> PgWireResult<()> {
    use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
    use datafusion::logical_expr::{Expr, expr::Cast};
    let ParamValues::List(values) = params else {
        return Ok(());
    };
    let mut casts = Vec::new();
    plan.apply_with_subqueries(|node| {
        node.apply_expressions(|expr| {
            expr.apply(|e| {
                if let Expr::Cast(Cast { expr, field }) = e
                    && let Expr::Placeholder(placeholder) = expr.as_ref()
                {
                    casts.push((placeholder.id.clone(), field.data_type().clone()));
                }
                Ok(TreeNodeRecursion::Continue)
            })
        })
    })
    .map_err(|e| user_error(e.into()))?;
    for (id, data_type) in casts {
        let Some(value) = id
            .trim_start_matches('$')
            .parse::<usize>()
            .ok()
            .and_then(|n| values.get(n.checked_sub(1)?))
        else {
            continue;
        };
        if value.value.is_null() || value.value.cast_to(&data_type).is_ok() {
            continue;
        }
        return Err(PgWireError::UserError(Box::new(ErrorInfo::new(
            "ERROR".into(),
            // invalid_text_representation
            "22P02".into(),
            format!(
                "parameter {id}: {:?} ({}) cannot be cast to {data_type}",
                value.value.to_string(),
                value.value.data_type()
            ),
        ))));
    }
    Ok(())
}

/// What a statement with AI calls cost the model, as a NOTICE before its
/// rows (psql prints it; psycopg hands it to a notice handler): its fresh
/// tokens, and the KV positions earlier statements left it.
pub(super) fn work_notice(out: &SqlOutput) -> Option<PgWireBackendMessage> {
    if out.calls.is_empty() {
        return None;
    }
    let fresh = out.measurements.fresh_tokens.map(|f| f.0)?;
    let mut text = format!("fresh tokens: {fresh} (positions computed by the model)");
    if let Some(held) = out.measurements.kv_held_at_start_tokens {
        text.push_str(&format!(
            "; the KV earlier statements left held {} positions when it began",
            held.0
        ));
    }
    let notice = ErrorInfo::new("NOTICE".into(), "00000".into(), text);
    Some(PgWireBackendMessage::NoticeResponse(notice.into()))
}

/// An engine error as the client sees it: PostgreSQL's ERROR with the whole
/// message.
pub(super) fn user_error(e: anyhow::Error) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "ERROR".into(),
        "XX000".into(),
        format!("{e:#}"),
    )))
}

/// Sets (or, with an invalid value, refuses) the session's
/// `statement_timeout`, which its later statements run under.
fn set_statement_timeout(
    client: &mut (impl ClientInfo + ?Sized),
    timeout: Result<Option<Duration>, String>,
) -> PgWireResult<Response> {
    let timeout = timeout.map_err(invalid_value)?;
    let metadata = client.metadata_mut();
    match timeout {
        Some(limit) => metadata.insert(
            STATEMENT_TIMEOUT_KEY.to_string(),
            limit.as_millis().to_string(),
        ),
        None => metadata.remove(STATEMENT_TIMEOUT_KEY),
    };
    Ok(Response::Execution(Tag::new("SET")))
}

/// The refusal of a setting's value.
fn invalid_value(message: String) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "ERROR".into(),
        // invalid_parameter_value
        "22023".into(),
        message,
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
    fn engine_settings_are_refused_in_any_spelling() {
        for sql in [
            "SET datafusion.execution.batch_size = 1",
            "SET \"datafusion\".\"execution\".\"batch_size\" TO 1",
            "SET \"aisql\".\"max_fresh_tokens\" = 1",
            "SET SESSION DataFusion.Execution.Batch_Size TO 1",
            "SET LOCAL \"datafusion.execution.batch_size\" = 1",
        ] {
            let setting = engine_setting(&statement(sql));
            assert!(
                setting.as_deref().is_some_and(|s| s.contains('.')),
                "{sql}: {setting:?}"
            );
        }
        assert_eq!(
            engine_setting(&statement(
                "SET \"datafusion\".\"execution\".\"batch_size\" TO 1"
            ))
            .as_deref(),
            Some("datafusion.execution.batch_size")
        );
        assert_eq!(engine_setting(&statement("SET search_path = public")), None);
        assert_eq!(
            engine_setting(&statement("SET statement_timeout = '1s'")),
            None
        );
    }

    #[test]
    fn statement_timeouts_are_read_in_postgresql_units_or_refused() {
        let value = |sql: &str| statement_timeout_value(&statement(sql));
        assert_eq!(
            value("SET statement_timeout = '1s'"),
            Some(Ok(Some(Duration::from_secs(1))))
        );
        assert_eq!(
            value("SET statement_timeout TO 1500"),
            Some(Ok(Some(Duration::from_millis(1500))))
        );
        assert_eq!(
            value("SET SESSION \"statement_timeout\" = '2min'"),
            Some(Ok(Some(Duration::from_secs(120))))
        );
        assert_eq!(
            value("SET statement_timeout = '0.5s'"),
            Some(Ok(Some(Duration::from_millis(500))))
        );
        assert_eq!(value("SET statement_timeout = 0"), Some(Ok(None)));
        assert_eq!(value("SET statement_timeout TO DEFAULT"), Some(Ok(None)));
        let err = value("SET statement_timeout = '1 fortnight'")
            .unwrap()
            .unwrap_err();
        assert!(
            err.contains("statement_timeout") && err.contains("fortnight"),
            "{err}"
        );
        assert_eq!(value("SET application_name = 'x'"), None);
    }

    #[test]
    fn copy_and_external_tables_are_refused_before_parsing() {
        for sql in [
            "COPY docs TO STDOUT",
            "copy docs FROM STDIN",
            "  COPY (SELECT 1) TO '/tmp/x'",
            "CREATE EXTERNAL TABLE t STORED AS CSV LOCATION '/etc/passwd'",
        ] {
            let Some(PgWireError::UserError(info)) = refused_by_its_words(sql) else {
                panic!("{sql} was not refused");
            };
            assert_eq!(info.code, "25006", "{sql}");
        }
        assert!(refused_by_its_words("SELECT 'COPY'").is_none());
        assert!(refused_by_its_words("CREATE VIEW v AS SELECT 1").is_none());
    }

    #[test]
    fn a_parameter_that_cannot_be_cast_is_named_with_its_type() {
        let ctx = SessionContext::new();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let plan = rt
            .block_on(ctx.state().create_logical_plan("SELECT $1::int + 1"))
            .unwrap();
        let params = |text: &str| {
            ParamValues::List(vec![
                datafusion::common::ScalarValue::Utf8(Some(text.into())).into(),
            ])
        };
        assert!(check_parameter_casts(&plan, &params("41")).is_ok());
        let Err(PgWireError::UserError(info)) = check_parameter_casts(&plan, &params("abc")) else {
            panic!("a text that is no integer was let through");
        };
        assert!(
            info.message.contains("$1") && info.message.contains("Int32"),
            "{}",
            info.message
        );
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
