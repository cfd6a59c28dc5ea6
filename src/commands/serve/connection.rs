//! One client connection of `aisql serve`, from accept to close, on pgwire's
//! message handling but with the server's own rules around it: TLS required
//! of every non-loopback client when the server has a certificate, a
//! deadline for authentication (`--auth-timeout-s`), a session slot taken
//! only as authentication completes ([`Admission`]), the largest message
//! read ([`message_limit`](super::message_limit)), and a statement stopped
//! when its client disconnects.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use pgwire::api::{ClientInfo, PgWireConnectionState, PgWireServerHandlers};
use pgwire::error::{ErrorInfo, PgWireError};
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
use pgwire::tokio::server::{
    MaybeTls, PgWireMessageServerCodec, negotiate_tls, process_error, process_message,
};
use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tokio_util::codec::{Framed, FramedParts};

use super::admission::{Admission, Authenticating, TOO_MANY_CONNECTIONS};
use super::message_limit::{Limited, Oversized, Tracker};
use super::statements::Handlers;

/// What every connection of one server shares.
pub struct Server {
    pub handlers: Arc<Handlers>,
    pub tls: Option<TlsAcceptor>,
    pub admission: Admission,
    /// How long a connection may take to authenticate.
    pub auth_timeout: Duration,
    /// The largest message a client may send (`--max-statement-bytes`).
    pub max_message_bytes: usize,
}

/// A client's connection: pgwire's framing over the message limit. `S` is
/// the prepared statement pgwire keeps (the query handler's type).
type Socket<S> = Framed<Limited<MaybeTls>, PgWireMessageServerCodec<S>>;

/// How often a running statement looks whether its client is gone.
const DISCONNECT_POLL: Duration = Duration::from_millis(100);

/// How long a FATAL error may take to send before the socket is dropped.
const FATAL_SEND_TIME: Duration = Duration::from_secs(2);

/// Serves the connection `tcp` from `peer`, admitted to authenticate with
/// `slot`, until the client leaves, fails to authenticate in time or breaks
/// the protocol.
pub async fn serve(
    server: Arc<Server>,
    tcp: TcpStream,
    peer: SocketAddr,
    slot: Authenticating,
) -> io::Result<()> {
    // A second handle on the socket, to see the client leave while the
    // first is busy with its statement.
    let watch = watcher(&tcp)?;
    let deadline = tokio::time::Instant::now() + server.auth_timeout;
    let negotiated =
        match tokio::time::timeout_at(deadline, negotiate_tls(tcp, server.tls.clone())).await {
            Ok(negotiated) => negotiated?,
            Err(_) => return Ok(()),
        };
    // A direct TLS hello to a server without a certificate.
    let Some(negotiated) = negotiated else {
        return Ok(());
    };
    let parts = negotiated.into_parts();
    let mut tracker = Tracker::new(server.max_message_bytes);
    tracker.skip_read(&parts.read_buf);
    let mut limited =
        FramedParts::new::<PgWireBackendMessage>(Limited::new(parts.io, tracker), parts.codec);
    limited.read_buf = parts.read_buf;
    limited.write_buf = parts.write_buf;
    let mut socket = Framed::from_parts(limited);

    if server.tls.is_some() && !socket.is_secure() && !peer.ip().to_canonical().is_loopback() {
        let message = format!(
            "this server requires TLS of clients not on its own machine ({peer} connected \
             without it): connect with sslmode=require"
        );
        // invalid_authorization_specification, as PostgreSQL's hostssl rule.
        send_fatal(&mut socket, "28000", message).await;
        return Ok(());
    }

    let startup = server.handlers.startup_handler();
    let simple = server.handlers.simple_query_handler();
    let extended = server.handlers.extended_query_handler();
    let copy = server.handlers.copy_handler();
    let cancel = server.handlers.cancel_handler();
    let mut slot = Some(slot);
    let mut session = None;
    let mut password_messages = 0;
    loop {
        let authenticating = matches!(
            socket.state(),
            PgWireConnectionState::AwaitingStartup
                | PgWireConnectionState::AuthenticationInProgress
        );
        if !authenticating {
            // Authenticated: the slot goes back to those still knocking.
            slot = None;
        }
        let next = if authenticating {
            match tokio::time::timeout_at(deadline, socket.next()).await {
                Ok(next) => next,
                Err(_) => {
                    let message = format!(
                        "authentication did not finish within {} s (--auth-timeout-s)",
                        server.auth_timeout.as_secs_f64()
                    );
                    // protocol_violation, as PostgreSQL's authentication_timeout.
                    send_fatal(&mut socket, "08P01", message).await;
                    break;
                }
            }
        } else {
            socket.next().await
        };
        let message = match next {
            Some(Ok(message)) => message,
            Some(Err(e)) => {
                // A message pgwire cannot read (malformed, too long for it):
                // the stream cannot be followed past it.
                let _ = process_error(&mut socket, e, false).await;
                break;
            }
            None => break,
        };
        if matches!(message, PgWireFrontendMessage::Terminate(_)) {
            break;
        }
        if authenticating && session.is_none() {
            if let PgWireFrontendMessage::PasswordMessageFamily(_) = message {
                password_messages += 1;
            }
            if completes_authentication(
                &message,
                server.handlers.needs_password(),
                password_messages,
            ) {
                match server.admission.session() {
                    Ok(permit) => session = Some(permit),
                    Err(reason) => {
                        send_fatal(&mut socket, TOO_MANY_CONNECTIONS, reason).await;
                        break;
                    }
                }
            }
        }
        let is_extended = match socket.state() {
            PgWireConnectionState::CopyInProgress(extended) => extended,
            _ => message.is_extended_query(),
        };
        let is_flush = matches!(message, PgWireFrontendMessage::Flush(_));
        let handled = process_message(
            message,
            &mut socket,
            startup.clone(),
            simple.clone(),
            extended.clone(),
            copy.clone(),
            cancel.clone(),
        );
        let result = if authenticating {
            handled.await
        } else {
            tokio::select! {
                result = handled => result,
                // Dropping the statement's future stops it (the model after
                // its forward batch in flight): nobody is left to read it.
                () = disconnected(&watch) => break,
            }
        };
        if let Err(e) = result {
            process_error(&mut socket, e, is_extended).await?;
        }
        if is_flush && let Some(oversized) = socket.get_mut().tracker.take_oversized() {
            let extended = !matches!(oversized.kind, b'Q');
            let error = too_large(oversized, server.max_message_bytes);
            process_error(&mut socket, error, extended).await?;
        }
    }
    drop(slot);
    drop(session);
    Ok(())
}

/// Whether `message` is the one that completes authentication when it is
/// right: the start-up packet of a server without a password, the second
/// SCRAM message (`password_messages` so far, this one included) of one with.
fn completes_authentication(
    message: &PgWireFrontendMessage,
    needs_password: bool,
    password_messages: usize,
) -> bool {
    if needs_password {
        matches!(message, PgWireFrontendMessage::PasswordMessageFamily(_)) && password_messages == 2
    } else {
        matches!(message, PgWireFrontendMessage::Startup(_))
    }
}

/// The error a message over `--max-statement-bytes` gets.
fn too_large(oversized: Oversized, max: usize) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "ERROR".into(),
        // program_limit_exceeded
        "54000".into(),
        format!(
            "a message of {} bytes ('{}') is over --max-statement-bytes {max}; it was skipped",
            oversized.bytes,
            char::from(oversized.kind).escape_default()
        ),
    )))
}

/// Sends a FATAL error, giving up after [`FATAL_SEND_TIME`] (a client that
/// reads nothing holds no task).
async fn send_fatal<S>(socket: &mut Socket<S>, code: &str, message: String) {
    let error = ErrorInfo::new("FATAL".into(), code.into(), message);
    let _ = tokio::time::timeout(
        FATAL_SEND_TIME,
        socket.send(PgWireBackendMessage::ErrorResponse(error.into())),
    )
    .await;
}

/// A second handle on `tcp` (the same socket), to watch for its end.
fn watcher(tcp: &TcpStream) -> io::Result<TcpStream> {
    use std::os::fd::AsFd;
    let fd = tcp.as_fd().try_clone_to_owned()?;
    TcpStream::from_std(std::net::TcpStream::from(fd))
}

/// Returns once the client has closed its end (or the socket failed).
/// Readiness is only looked at, never consumed: the bytes stay for pgwire.
async fn disconnected(watch: &TcpStream) {
    loop {
        match watch.ready(Interest::READABLE).await {
            Ok(ready) if ready.is_read_closed() || ready.is_error() => return,
            Ok(_) => tokio::time::sleep(DISCONNECT_POLL).await,
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authentication_completes_at_the_startup_or_the_second_scram_message() {
        use pgwire::messages::startup::{PasswordMessageFamily, Startup};
        let startup = PgWireFrontendMessage::Startup(Startup::new());
        assert!(completes_authentication(&startup, false, 0));
        assert!(!completes_authentication(&startup, true, 0));
        let password = PgWireFrontendMessage::PasswordMessageFamily(PasswordMessageFamily::Raw(
            bytes::BytesMut::from(&b"x"[..]),
        ));
        assert!(!completes_authentication(&password, true, 1));
        assert!(completes_authentication(&password, true, 2));
    }
}
