//! `aisql worker`: one model on one device, serving the AI work coordinators
//! send (`--workers`), until Ctrl-C or SIGTERM.

use std::io::Write;
use std::net::SocketAddr;

use aisql_engine::distributed::{ServedModel, serve};
use aisql_engine::scheduler::answer_identity;
use anyhow::{Context, bail};

use super::UsageError;
use super::backend::meta_text;
use crate::cli::{BackendKind, WorkerArgs};

/// Where a worker listens without `--listen` or `AISQL_WORKER_LISTEN`.
const DEFAULT_LISTEN: &str = "127.0.0.1:7878";

/// The environment variable a loopback listen address may come from.
const LISTEN_ENV: &str = "AISQL_WORKER_LISTEN";

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
    if b.gpu.as_ref().is_some_and(|g| g.len() > 1) || b.cpu_workers.is_some_and(|n| n > 1) {
        refuse("start one `aisql worker` per device")?;
    }
    let (backend, meta) = super::backend::build(b, None, &[])?;
    let dtype = meta_text(&meta, "dtype").to_string();
    let device = meta_text(&meta, "device").to_string();
    // Prompts arrive rendered: the coordinator names the format.
    let identity = answer_identity(&b.model, &dtype, Default::default())
        .with_context(|| format!("hashing model {:?}", b.model))?;
    let rt = super::runtime()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("listening on {listen}"))?;
        let bound = listener.local_addr()?;
        if !bound.ip().is_loopback() {
            eprintln!(
                "aisql worker: {bound} is not a loopback address: anyone who reaches it can use this model"
            );
        }
        // The line a script or test waits for: the port, if 0 was asked.
        println!("listening on {bound} ({}, {dtype}, {device})", b.model);
        std::io::stdout().flush()?;
        let served = ServedModel::new(backend, identity, meta);
        serve(listener, served, shutdown_signal()).await?;
        eprintln!("aisql worker on {bound}: stopped");
        Ok(())
    })
}

/// The listen address: `--listen` as given (any address), else
/// `AISQL_WORKER_LISTEN` if it is a loopback address, else the default.
fn listen_address(flag: Option<&str>, env: Option<String>) -> anyhow::Result<SocketAddr> {
    let parse = |text: &str, from: &str| -> anyhow::Result<SocketAddr> {
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
    };
    if let Some(flag) = flag {
        return parse(flag, "--listen");
    }
    let Some(env) = env.filter(|e| !e.trim().is_empty()) else {
        return parse(DEFAULT_LISTEN, "the default");
    };
    let addr = parse(&env, LISTEN_ENV)?;
    if !addr.ip().is_loopback() {
        bail!(UsageError(format!(
            "{LISTEN_ENV}={env} is not a loopback address: a worker answers anyone who reaches it, so only --listen {addr} on the command line opens it to a network"
        )));
    }
    Ok(addr)
}

/// Completes on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
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
}
