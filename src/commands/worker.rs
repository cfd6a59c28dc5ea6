//! `aisql worker`: one model on one device, serving the AI work coordinators
//! send (`--workers`), until Ctrl-C or SIGTERM; and the shared worker token
//! both sides read ([`worker_token`]).

use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use aisql_engine::inference::distributed::{ServeOptions, ServedModel, serve};
use aisql_engine::inference::scheduler::answer_identity;
use aisql_engine::{errln, outln};
use anyhow::{Context, bail};

use super::UsageError;
use crate::cli::{BackendKind, WorkerArgs};

/// Where a worker listens without `--listen` or `AISQL_WORKER_LISTEN`.
const DEFAULT_LISTEN: &str = "127.0.0.1:7878";

/// The environment variable a loopback listen address may come from.
const LISTEN_ENV: &str = "AISQL_WORKER_LISTEN";

/// The environment variable the shared worker token may come from (worker and
/// coordinator), when no token file is given.
pub const TOKEN_ENV: &str = "AISQL_WORKER_TOKEN";

/// The owner's generated worker token, taken by a loopback worker given none
/// and sent by a coordinator given none to loopback workers.
pub const GENERATED_TOKEN: &str = "worker.token";

/// A secret's text: from `file` (named by `flag` in errors), else from the
/// environment variable `env_name` (its value `env`), else none; with where it
/// came from, for the caller's own checks. An unreadable file, or one that is
/// not a regular file (a FIFO would hang the start), is a usage error naming it.
pub fn read_secret(
    file: Option<&Path>,
    flag: &str,
    env: Option<String>,
    env_name: &str,
) -> anyhow::Result<Option<(String, String)>> {
    Ok(match (file, env) {
        (Some(file), _) => {
            let text = aisql_engine::data::input_file::read_to_string(file).map_err(|e| {
                UsageError(format!("{flag} {}: cannot read it ({e})", file.display()))
            })?;
            Some((text, format!("{flag} {}", file.display())))
        }
        (None, Some(env)) => Some((env, env_name.to_string())),
        (None, None) => None,
    })
}

/// The shared worker token: from `file` (named by `flag` in errors), else from
/// [`TOKEN_ENV`] (`env`), else none. Surrounding whitespace is dropped; an
/// unreadable or empty file, or a token of other than printable ASCII (it
/// travels as a header), is a usage error naming where it came from.
pub fn worker_token(
    file: Option<&Path>,
    flag: &str,
    env: Option<String>,
) -> anyhow::Result<Option<String>> {
    let Some((text, from)) = read_secret(file, flag, env, TOKEN_ENV)? else {
        return Ok(None);
    };
    let token = text.trim();
    if token.is_empty() {
        bail!(UsageError(format!("{from}: the worker token is empty")));
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        bail!(UsageError(format!(
            "{from}: the worker token must be printable ASCII without spaces"
        )));
    }
    Ok(Some(token.to_string()))
}

/// The bytes of `file`, a regular file, named by `flag` in the error.
pub fn read_pem(file: &Path, flag: &str) -> anyhow::Result<Vec<u8>> {
    aisql_engine::data::input_file::read(file)
        .map_err(|e| UsageError(format!("{flag} {}: cannot read it ({e})", file.display())).into())
}

/// Runs the worker.
pub fn run(args: WorkerArgs) -> anyhow::Result<()> {
    let listen = listen_address(args.listen.as_deref(), std::env::var(LISTEN_ENV).ok())?;
    let b = &args.backend;
    let refuse = |what: &str| -> anyhow::Result<()> {
        Err(UsageError(format!(
            "aisql worker serves one model on one device: {what}"
        ))
        .into())
    };
    if b.backend != BackendKind::Model || b.simulate {
        refuse("--backend oracle and --simulate run on the coordinator")?;
    }
    if b.workers.is_some() {
        refuse("--workers is the coordinator's flag")?;
    }
    if b.answer_cache.is_some() {
        refuse("--answer-cache belongs on the coordinator, which sees every answer")?;
    }
    if b.model.gpu.as_ref().is_some_and(|g| g.len() > 1) || b.cpu_workers.is_some_and(|n| n > 1) {
        refuse("start one `aisql worker` per device")?;
    }
    let mut token = worker_token(
        args.token_file.as_deref(),
        "--token-file",
        std::env::var(TOKEN_ENV).ok(),
    )?;
    // Loopback is every local user's: without a token of its own the worker
    // takes its owner's generated one, which the owner's coordinators read.
    if token.is_none() && listen.ip().is_loopback() {
        let (secret, file) = super::owner_secret::get_or_make(GENERATED_TOKEN)?;
        errln!(
            "aisql worker: no --token-file: coordinators must give the token in {} (this \
             user's coordinators read it themselves)",
            file.display()
        )?;
        token = Some(secret);
    }
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            Some((read_pem(cert, "--tls-cert")?, read_pem(key, "--tls-key")?))
        }
        _ => None,
    };
    exposure_check(listen, token.is_some(), tls.is_some(), args.insecure)?;
    let spec = b.spec()?;
    let mut guard = aisql_engine::data::write_guard::WriteGuard::new();
    super::paths::add_backend_files(&mut guard, &spec);
    for (file, what) in [
        (&args.token_file, "the --token-file"),
        (&args.tls_cert, "the --tls-cert file"),
        (&args.tls_key, "the --tls-key file"),
    ] {
        if let Some(file) = file {
            guard.add(file, what);
        }
    }
    super::paths::check_stores(&guard, &spec)?;
    let (backend, meta) = super::backend::build(&spec, None, Some(&[]))?;
    let dtype = meta.dtype().to_string();
    let device = meta.device().to_string();
    // Prompts arrive rendered: the coordinator names the format.
    let identity = answer_identity(&b.model.name, &dtype, Default::default())
        .with_context(|| format!("hashing model {:?}", b.model.name))?;
    let secured = token.is_some() && tls.is_some();
    let options = ServeOptions { token, tls };
    let rt = super::runtime()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("listening on {listen}"))?;
        let bound = listener.local_addr()?;
        if !bound.ip().is_loopback() && !secured {
            errln!(
                "aisql worker: {bound} is not a loopback address and --insecure is given: anyone who reaches it without the token, or on the path, can use this model or read its traffic"
            )?;
        }
        // The line a script or test waits for: the port, if 0 was asked.
        outln!("listening on {bound} ({}, {dtype}, {device})", b.model.name)?;
        std::io::stdout().flush()?;
        let served = ServedModel::new(backend, identity, meta)
            .with_query_idle(Duration::from_secs(args.query_idle_timeout));
        serve(listener, served, options, shutdown_signal()).await?;
        errln!("aisql worker on {bound}: stopped")?;
        Ok(())
    })
}

/// `text` (from `from`, for the error) as IP:PORT; `localhost:PORT` is
/// 127.0.0.1:PORT.
pub fn parse_listen(text: &str, from: &str) -> anyhow::Result<SocketAddr> {
    let text = text.trim();
    let text = match text.strip_prefix("localhost:") {
        Some(port) => format!("127.0.0.1:{port}"),
        None => text.to_string(),
    };
    text.parse().map_err(|_| {
        UsageError(format!(
            "{from} {text:?} is not IP:PORT (e.g. 127.0.0.1:7878)"
        ))
        .into()
    })
}

/// The listen address: `--listen` as given (any address), else
/// `AISQL_WORKER_LISTEN` if it is a loopback address, else the default.
fn listen_address(flag: Option<&str>, env: Option<String>) -> anyhow::Result<SocketAddr> {
    if let Some(flag) = flag {
        return parse_listen(flag, "--listen");
    }
    let Some(env) = env.filter(|e| !e.trim().is_empty()) else {
        return parse_listen(DEFAULT_LISTEN, "the default");
    };
    let addr = parse_listen(&env, LISTEN_ENV)?;
    if !addr.ip().is_loopback() {
        bail!(UsageError(format!(
            "{LISTEN_ENV}={env} is not a loopback address: a worker answers anyone who reaches it, so only --listen {addr} on the command line opens it to a network"
        )));
    }
    Ok(addr)
}

/// A worker on a non-loopback address needs a token and TLS, unless
/// `--insecure`: it answers whoever reaches it, and its traffic holds documents.
fn exposure_check(
    listen: SocketAddr,
    token: bool,
    tls: bool,
    insecure: bool,
) -> anyhow::Result<()> {
    if listen.ip().is_loopback() || insecure || (token && tls) {
        return Ok(());
    }
    let missing = match (token, tls) {
        (false, false) => {
            "a token (--token-file or AISQL_WORKER_TOKEN) and TLS (--tls-cert, --tls-key)"
        }
        (false, true) => "a token (--token-file or AISQL_WORKER_TOKEN)",
        _ => "TLS (--tls-cert, --tls-key)",
    };
    bail!(UsageError(format!(
        "--listen {listen} is not a loopback address: a worker there needs {missing}, or --insecure"
    )))
}

/// Completes on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let terminated = async {
            match signal(SignalKind::terminate()) {
                Ok(mut term) => {
                    term.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminated => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_flag_opens_a_worker_to_a_network() {
        let addr = |f: Option<&str>, e: Option<&str>| listen_address(f, e.map(String::from));
        assert_eq!(addr(None, None).unwrap().to_string(), DEFAULT_LISTEN);
        assert_eq!(
            addr(Some("0.0.0.0:9"), None).unwrap().to_string(),
            "0.0.0.0:9"
        );
        assert_eq!(
            addr(None, Some("localhost:5")).unwrap().to_string(),
            "127.0.0.1:5"
        );
        assert_eq!(addr(None, Some("[::1]:5")).unwrap().to_string(), "[::1]:5");
        let err = addr(None, Some("0.0.0.0:9")).unwrap_err().to_string();
        assert!(
            err.contains("not a loopback address") && err.contains("--listen"),
            "{err}"
        );
        let err = addr(Some("nine"), None).unwrap_err().to_string();
        assert!(err.contains("--listen \"nine\""), "{err}");
    }

    #[test]
    fn a_network_address_needs_token_and_tls_unless_insecure() {
        let lan: SocketAddr = "0.0.0.0:9".parse().unwrap();
        let lo: SocketAddr = "127.0.0.1:9".parse().unwrap();
        assert!(exposure_check(lo, false, false, false).is_ok());
        assert!(exposure_check(lan, true, true, false).is_ok());
        assert!(exposure_check(lan, false, false, true).is_ok());
        for (token, tls, missing) in [
            (false, false, "a token"),
            (true, false, "TLS"),
            (false, true, "a token"),
        ] {
            let err = exposure_check(lan, token, tls, false)
                .unwrap_err()
                .to_string();
            assert!(err.contains(missing) && err.contains("--insecure"), "{err}");
        }
    }

    #[test]
    fn tokens_come_from_a_file_or_the_environment_and_are_never_empty() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "  s3cret\n").unwrap();
        let t = |f: Option<&Path>, e: Option<&str>| {
            worker_token(f, "--token-file", e.map(String::from))
        };
        assert_eq!(
            t(Some(&file), Some("env")).unwrap().as_deref(),
            Some("s3cret")
        );
        assert_eq!(t(None, Some("env")).unwrap().as_deref(), Some("env"));
        assert_eq!(t(None, None).unwrap(), None);
        std::fs::write(&file, "\n").unwrap();
        let err = t(Some(&file), None).unwrap_err().to_string();
        assert!(
            err.contains("empty") && err.contains(&file.display().to_string()),
            "{err}"
        );
        let gone = dir.path().join("gone");
        let err = t(Some(&gone), None).unwrap_err().to_string();
        assert!(err.contains("cannot read") && err.contains("gone"), "{err}");
        let err = t(None, Some("a b")).unwrap_err().to_string();
        assert!(
            err.contains("AISQL_WORKER_TOKEN") && err.contains("printable"),
            "{err}"
        );
    }
}
