//! Who `aisql serve` lets in, and how many at once. A connection still
//! authenticating holds a slot of its own bounded pool (`--max-authenticating`,
//! of which one client address may hold a quarter), never a session's; an
//! authenticated session holds one of `--max-connections`. A client refused
//! either way reads PostgreSQL's "too many connections" (SQLSTATE 53300), not
//! a closed socket, from a bounded number of small refusal tasks.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use pgwire::error::ErrorInfo;
use pgwire::messages::PgWireBackendMessage;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// PostgreSQL's too_many_connections.
pub const TOO_MANY_CONNECTIONS: &str = "53300";

/// How many refusals are answered at once; past them a refused socket is
/// closed unanswered (a flood, not a client to inform).
const REFUSALS_AT_ONCE: usize = 64;

/// How long a refused client has to read its refusal.
const REFUSAL_TIME: Duration = Duration::from_secs(2);

/// The pools a server's connections are admitted from.
pub struct Admission {
    authenticating: Arc<Semaphore>,
    max_authenticating: usize,
    per_address: usize,
    by_address: Arc<Mutex<HashMap<IpAddr, usize>>>,
    sessions: Arc<Semaphore>,
    max_sessions: usize,
    refusals: Arc<Semaphore>,
}

/// A connection's slot while it authenticates: in the pool and in its
/// address's share, both given back when dropped.
pub struct Authenticating {
    _permit: OwnedSemaphorePermit,
    address: IpAddr,
    by_address: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

impl Drop for Authenticating {
    fn drop(&mut self) {
        let mut counts = self.by_address.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = counts.get_mut(&self.address) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.address);
            }
        }
    }
}

impl Admission {
    /// Pools of `max_authenticating` connections authenticating (a quarter
    /// of them, at least one, per client address) and `max_sessions`
    /// sessions.
    pub fn new(max_authenticating: usize, max_sessions: usize) -> Self {
        Self {
            authenticating: Arc::new(Semaphore::new(max_authenticating)),
            max_authenticating,
            per_address: (max_authenticating / 4).max(1),
            by_address: Arc::new(Mutex::new(HashMap::new())),
            sessions: Arc::new(Semaphore::new(max_sessions)),
            max_sessions,
            refusals: Arc::new(Semaphore::new(REFUSALS_AT_ONCE)),
        }
    }

    /// A slot to authenticate in for a client at `address`, or why not.
    pub fn authenticating(&self, address: IpAddr) -> Result<Authenticating, String> {
        let address = address.to_canonical();
        let mut counts = self.by_address.lock().unwrap_or_else(|p| p.into_inner());
        let held = counts.get(&address).copied().unwrap_or(0);
        if held >= self.per_address {
            return Err(format!(
                "too many connections: {held} from {address} are authenticating (a quarter \
                 of --max-authenticating {})",
                self.max_authenticating
            ));
        }
        let Ok(permit) = self.authenticating.clone().try_acquire_owned() else {
            return Err(format!(
                "too many connections: {} are authenticating (--max-authenticating)",
                self.max_authenticating
            ));
        };
        counts.insert(address, held + 1);
        Ok(Authenticating {
            _permit: permit,
            address,
            by_address: self.by_address.clone(),
        })
    }

    /// A session's slot, taken as its authentication completes, or why not.
    pub fn session(&self) -> Result<OwnedSemaphorePermit, String> {
        self.sessions.clone().try_acquire_owned().map_err(|_| {
            format!(
                "too many connections: {} sessions are open (--max-connections)",
                self.max_sessions
            )
        })
    }

    /// Answers `socket` with `reason` in the background when a refusal task
    /// is free, else closes it.
    pub fn refuse(&self, socket: TcpStream, reason: String) {
        let Ok(permit) = self.refusals.clone().try_acquire_owned() else {
            return;
        };
        tokio::spawn(async move {
            let _ = tokio::time::timeout(REFUSAL_TIME, refuse(socket, &reason)).await;
            drop(permit);
        });
    }
}

/// The refusal as a client expects it: its SSL or GSS request (if any)
/// declined, its start-up packet read, then a FATAL error; the socket is
/// drained until the client closes, so that the error is not lost to a reset.
async fn refuse(mut socket: TcpStream, reason: &str) -> std::io::Result<()> {
    const SSL_REQUEST: u32 = 80877103;
    const GSS_REQUEST: u32 = 80877104;
    let mut header = [0u8; 8];
    socket.read_exact(&mut header).await?;
    let code = u32::from_be_bytes([header[4], header[5], header[6], header[7]]);
    if code == SSL_REQUEST || code == GSS_REQUEST {
        socket.write_all(b"N").await?;
        socket.read_exact(&mut header).await?;
    }
    let length = u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize;
    // The rest of the start-up packet (at most pgwire's 10,000 bytes).
    let mut rest = length.saturating_sub(8).min(10_000);
    let mut sink = [0u8; 1024];
    while rest > 0 {
        let n = socket.read(&mut sink[..rest.min(1024)]).await?;
        if n == 0 {
            return Ok(());
        }
        rest -= n;
    }
    socket
        .write_all(&fatal_bytes(TOO_MANY_CONNECTIONS, reason))
        .await?;
    socket.shutdown().await?;
    while socket.read(&mut sink).await? > 0 {}
    Ok(())
}

/// A FATAL ErrorResponse, encoded.
pub fn fatal_bytes(code: &str, message: &str) -> Vec<u8> {
    let mut buf = BytesMut::new();
    let error = ErrorInfo::new("FATAL".into(), code.into(), message.into());
    // Encoding a short error cannot fail; an empty answer is a closed socket.
    let _ = PgWireBackendMessage::ErrorResponse(error.into()).encode(&mut buf);
    buf.to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_holds_a_quarter_of_the_authenticating_pool() {
        let admission = Admission::new(8, 1);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let first = admission.authenticating(a).unwrap();
        let _second = admission.authenticating(a).unwrap();
        let err = admission.authenticating(a).err().unwrap();
        assert!(
            err.contains("10.0.0.1") && err.contains("too many"),
            "{err}"
        );
        // Another address still gets in; a slot given back is free again.
        let _other = admission.authenticating(b).unwrap();
        drop(first);
        let _again = admission.authenticating(a).unwrap();
        // Sessions come from a pool of their own.
        let session = admission.session().unwrap();
        assert!(
            admission
                .session()
                .err()
                .unwrap()
                .contains("--max-connections")
        );
        drop(session);
        assert!(admission.session().is_ok());
    }

    #[test]
    fn the_authenticating_pool_is_bounded_across_addresses() {
        let admission = Admission::new(4, 1);
        let held: Vec<_> = (1..=4)
            .map(|i| {
                admission
                    .authenticating(format!("10.0.0.{i}").parse().unwrap())
                    .unwrap()
            })
            .collect();
        let err = admission
            .authenticating("10.0.0.9".parse().unwrap())
            .err()
            .unwrap();
        assert!(err.contains("--max-authenticating"), "{err}");
        drop(held);
        assert!(
            admission
                .authenticating("10.0.0.9".parse().unwrap())
                .is_ok()
        );
    }
}
