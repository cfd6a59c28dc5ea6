//! Who may use `aisql serve`: one password for every client (any user and
//! database name), checked with SCRAM-SHA-256 so it never crosses the wire.
//! On loopback without one given, the owner's generated password guards it.

use std::fmt::Debug;
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use futures::Sink;
use pgwire::api::auth::noop::NoopStartupHandler;
use pgwire::api::auth::sasl::SASLAuthStartupHandler;
use pgwire::api::auth::sasl::scram::{SCRAM_ITERATIONS, ScramAuth, gen_salted_password};
use pgwire::api::auth::{
    AuthSource, DefaultServerParameterProvider, LoginInfo, Password, StartupHandler,
};
use pgwire::api::{ClientInfo, ConnectionManager};
use pgwire::error::{PgWireError, PgWireResult};
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};

use super::UsageError;

/// The environment variable the password may come from.
pub const PASSWORD_ENV: &str = "AISQL_PASSWORD";

/// The owner's generated password, taken on loopback when none is given
/// ([`owner_secret`](crate::commands::owner_secret)).
pub const GENERATED_PASSWORD: &str = "serve.password";

/// The password: from `file`, else from [`PASSWORD_ENV`] (`env`), else none.
/// A line end after it is dropped; an unreadable or empty file or variable is
/// a usage error naming where it came from.
pub fn password(file: Option<&Path>, env: Option<String>) -> anyhow::Result<Option<String>> {
    let Some((text, from)) =
        super::super::worker::read_secret(file, "--password-file", env, PASSWORD_ENV)?
    else {
        return Ok(None);
    };
    let password = text.trim_end_matches(['\r', '\n']);
    if password.is_empty() {
        return Err(UsageError(format!("{from}: the password is empty")).into());
    }
    Ok(Some(password.to_string()))
}

/// The salted password SCRAM checks clients against, computed once.
#[derive(Debug)]
pub struct Verifier {
    salted: Password,
}

impl Verifier {
    /// The verifier of `password`, under a fresh random salt.
    pub fn new(password: String) -> Self {
        let mut salt = [0u8; 16];
        // Without the OS's randomness a fixed salt still hides the password
        // (SCRAM's proof never carries it); it only eases precomputation.
        let _ = getrandom::fill(&mut salt);
        let salted = gen_salted_password(&password, &salt, SCRAM_ITERATIONS);
        Self {
            salted: Password::new(Some(salt.to_vec()), salted),
        }
    }
}

#[async_trait]
impl AuthSource for Verifier {
    async fn get_password(&self, _login: &LoginInfo) -> PgWireResult<Password> {
        Ok(self.salted.clone())
    }
}

/// The startup of one connection: SCRAM when the server has a password, none
/// on a loopback server without one. Either way the connection is registered
/// for cancel requests.
pub enum Startup {
    Open(OpenStartup),
    Scram(Box<SASLAuthStartupHandler<DefaultServerParameterProvider>>),
}

impl Startup {
    /// A new startup (SCRAM keeps per-connection state, so one per connection).
    pub fn new(verifier: Option<&Arc<Verifier>>, connections: &Arc<ConnectionManager>) -> Self {
        match verifier {
            None => Startup::Open(OpenStartup {
                connections: connections.clone(),
            }),
            Some(verifier) => {
                let mut scram = ScramAuth::new(verifier.clone());
                scram.set_iterations(SCRAM_ITERATIONS);
                Startup::Scram(Box::new(
                    SASLAuthStartupHandler::new(Arc::new(server_parameters()))
                        .with_scram(scram)
                        .with_connection_manager(connections.clone()),
                ))
            }
        }
    }
}

/// What the server tells clients about itself at startup: it is read-only.
fn server_parameters() -> DefaultServerParameterProvider {
    let mut parameters = DefaultServerParameterProvider::default();
    parameters.is_superuser = false;
    parameters.default_transaction_read_only = true;
    parameters
}

#[async_trait]
impl StartupHandler for Startup {
    async fn on_startup<C>(
        &self,
        client: &mut C,
        message: PgWireFrontendMessage,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        match self {
            Startup::Open(open) => open.on_startup(client, message).await,
            Startup::Scram(scram) => scram.on_startup(client, message).await,
        }
    }
}

/// The startup of a server without a password.
pub struct OpenStartup {
    connections: Arc<ConnectionManager>,
}

#[async_trait]
impl NoopStartupHandler for OpenStartup {
    fn connection_manager(&self) -> Option<Arc<ConnectionManager>> {
        Some(self.connections.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_come_from_a_file_or_the_environment_and_are_never_empty() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pw");
        std::fs::write(&file, "s3cret\n").unwrap();
        assert_eq!(
            password(Some(&file), Some("other".into()))
                .unwrap()
                .as_deref(),
            Some("s3cret")
        );
        assert_eq!(
            password(None, Some("env-pw".into())).unwrap().as_deref(),
            Some("env-pw")
        );
        assert_eq!(password(None, None).unwrap(), None);
        std::fs::write(&file, "\n").unwrap();
        let err = password(Some(&file), None).unwrap_err().to_string();
        assert!(err.contains("empty") && err.contains("pw"), "{err}");
        let err = password(Some(&dir.path().join("missing")), None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("cannot read"), "{err}");
    }

    #[cfg(unix)]
    #[test]
    fn a_password_file_that_is_a_fifo_is_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("pw");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        // Opening a FIFO nobody writes to would block this test forever.
        let err = password(Some(&fifo), None).unwrap_err().to_string();
        assert!(
            err.contains("FIFO") && err.contains("--password-file"),
            "{err}"
        );
        let err = crate::commands::worker::read_pem(&fifo, "--tls-key")
            .unwrap_err()
            .to_string();
        assert!(err.contains("FIFO") && err.contains("--tls-key"), "{err}");
    }
}
