//! `aisql serve`: SQL with AI functions over the PostgreSQL wire protocol,
//! read-only, on loopback unless `--listen` names another address; a password
//! (SCRAM-SHA-256) guards any other, and TLS unless `--insecure`. Every
//! session's statements run on one model, one at a time ([`Connection`]).
//! Each connection's life is [`connection`]'s; who is let in, [`admission`]'s.

mod admission;
mod auth;
mod connection;
mod message_limit;
mod statements;
mod streamed;

use std::net::SocketAddr;
use std::sync::Arc;

use aisql_engine::{errln, outln};
use anyhow::{Context, bail};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::UsageError;
use super::connect::Connection;
use super::worker::{parse_listen, read_pem, shutdown_signal};
use crate::cli::ServeArgs;

/// Where the server listens without `--listen`: PostgreSQL's port plus one,
/// so a local PostgreSQL keeps its own.
const DEFAULT_LISTEN: &str = "127.0.0.1:5433";

/// Runs the server until Ctrl-C or SIGTERM.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let listen = parse_listen(args.listen.as_deref().unwrap_or(DEFAULT_LISTEN), "--listen")?;
    let mut password = auth::password(
        args.password_file.as_deref(),
        std::env::var(auth::PASSWORD_ENV).ok(),
    )?;
    // Loopback is every local user's: without a password of its own the
    // server takes its owner's generated one.
    let mut generated = None;
    if password.is_none() && listen.ip().is_loopback() {
        let (secret, file) = super::owner_secret::get_or_make(auth::GENERATED_PASSWORD)?;
        password = Some(secret);
        generated = Some(file);
    }
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(tls_acceptor(cert, key)?),
        _ => None,
    };
    exposure_check(listen, password.is_some(), tls.is_some(), args.insecure)?;
    let rt = super::runtime()?;
    rt.block_on(async move {
        // Statements may never write: the server has no --allow-writes.
        let config = args.connect.config(false)?;
        let connection = Arc::new(Connection::open_read_only(&config).await?);
        let handlers = Arc::new(statements::Handlers::new(
            connection,
            password.map(auth::Verifier::new),
        )?);
        let listener = TcpListener::bind(listen)
            .await
            .with_context(|| format!("listening on {listen}"))?;
        let bound = listener.local_addr()?;
        outln!(
            "listening on {bound} ({}, password required{})",
            if tls.is_some() { "TLS" } else { "no TLS" },
            match &generated {
                Some(file) => format!(": the one in {}", file.display()),
                None => String::new(),
            }
        )?;
        use std::io::Write;
        std::io::stdout().flush()?;
        let server = Arc::new(connection::Server {
            handlers,
            tls,
            admission: admission::Admission::new(args.max_authenticating, args.max_connections),
            auth_timeout: args.auth_timeout_s,
            max_message_bytes: args.max_statement_bytes,
        });
        let shutdown = shutdown_signal();
        tokio::pin!(shutdown);
        loop {
            let (socket, peer) = tokio::select! {
                _ = &mut shutdown => break,
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        let _ = errln!("aisql serve: accepting a connection: {e}");
                        // Out of file descriptors, say: let some close.
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            // Admitted before anything is read or allocated for it.
            let slot = match server.admission.authenticating(peer.ip()) {
                Ok(slot) => slot,
                Err(reason) => {
                    server.admission.refuse(socket, reason);
                    continue;
                }
            };
            let server = server.clone();
            tokio::spawn(async move {
                if let Err(e) = connection::serve(server, socket, peer, slot).await {
                    let _ = errln!("aisql serve: connection from {peer}: {e}");
                }
            });
        }
        errln!("aisql serve: stopped")?;
        Ok(())
    })
}

/// A server on a non-loopback address needs a password, and TLS unless
/// `--insecure`: it answers whoever reaches it, and its rows hold documents.
fn exposure_check(
    listen: SocketAddr,
    password: bool,
    tls: bool,
    insecure: bool,
) -> anyhow::Result<()> {
    if listen.ip().is_loopback() {
        return Ok(());
    }
    if !password {
        bail!(UsageError(format!(
            "--listen {listen} is not a loopback address: the server there needs a password \
             (--password-file or {})",
            auth::PASSWORD_ENV
        )));
    }
    if !tls && !insecure {
        bail!(UsageError(format!(
            "--listen {listen} is not a loopback address: the server there needs TLS \
             (--tls-cert, --tls-key), or --insecure"
        )));
    }
    Ok(())
}

/// The TLS acceptor of a PEM certificate chain and key; a file that cannot be
/// read or holds no certificate or key is a usage error naming it.
fn tls_acceptor(cert: &std::path::Path, key: &std::path::Path) -> anyhow::Result<TlsAcceptor> {
    let certs = CertificateDer::pem_slice_iter(&read_pem(cert, "--tls-cert")?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| UsageError(format!("--tls-cert {}: {e}", cert.display())))?;
    if certs.is_empty() {
        bail!(UsageError(format!(
            "--tls-cert {}: no PEM certificate in it",
            cert.display()
        )));
    }
    let key = PrivateKeyDer::from_pem_slice(&read_pem(key, "--tls-key")?).map_err(|e| {
        UsageError(format!(
            "--tls-key {}: no PEM private key in it ({e})",
            key.display()
        ))
    })?;
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| UsageError(format!("--tls-cert/--tls-key: {e}")))?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_goes_without_a_password_and_tls() {
        let lan: SocketAddr = "0.0.0.0:5433".parse().unwrap();
        let lo: SocketAddr = "127.0.0.1:5433".parse().unwrap();
        assert!(exposure_check(lo, false, false, false).is_ok());
        let err = exposure_check(lan, false, true, true)
            .unwrap_err()
            .to_string();
        assert!(err.contains("needs a password"), "{err}");
        let err = exposure_check(lan, true, false, false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("needs TLS"), "{err}");
        assert!(exposure_check(lan, true, false, true).is_ok());
        assert!(exposure_check(lan, true, true, false).is_ok());
    }

    #[test]
    fn tls_files_without_pem_are_usage_errors_naming_them() {
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("cert.pem");
        let key = dir.path().join("key.pem");
        std::fs::write(&cert, "not a certificate").unwrap();
        std::fs::write(&key, "not a key").unwrap();
        let Err(err) = tls_acceptor(&cert, &key) else {
            panic!("a certificate that is not PEM was accepted");
        };
        assert!(err.downcast_ref::<UsageError>().is_some());
        assert!(err.to_string().contains("cert.pem"), "{err}");
    }
}
