//! The largest message `aisql serve` reads from a client
//! (`--max-statement-bytes`), enforced on the byte stream below pgwire's
//! framing: a message over the limit is skipped as it arrives, never
//! buffered, and a Flush takes its place so that the connection loop can
//! answer it with an error and the session goes on.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A message that was over the limit: its type byte and length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Oversized {
    pub kind: u8,
    pub bytes: usize,
}

/// A Flush message, the stand-in of a skipped one (it asks nothing).
const FLUSH: [u8; 5] = [b'H', 0, 0, 0, 4];

/// Where the reader is in the client's stream of messages.
#[derive(Debug)]
enum Position {
    /// Reading a header: 4 bytes for the untyped start-up packet, 5 (type and
    /// length) for every later message.
    Header {
        bytes: [u8; 5],
        have: usize,
        typed: bool,
    },
    /// Passing this many body bytes on.
    Body(usize),
    /// Dropping this many body bytes.
    Skip(usize),
}

/// Tracks message boundaries and decides which bytes pass.
#[derive(Debug)]
pub struct Tracker {
    max: usize,
    position: Position,
    oversized: Option<Oversized>,
}

impl Tracker {
    /// A tracker at the start of a connection (the start-up packet next),
    /// passing messages of at most `max` bytes.
    pub fn new(max: usize) -> Self {
        Self {
            max,
            position: Position::Header {
                bytes: [0; 5],
                have: 0,
                typed: false,
            },
            oversized: None,
        }
    }

    /// Moves past `bytes` that were already read (and will pass as they are).
    pub fn skip_read(&mut self, bytes: &[u8]) {
        let mut sink = Vec::new();
        self.feed(bytes, &mut sink);
    }

    /// The message over the limit since the last call, if any.
    pub fn take_oversized(&mut self) -> Option<Oversized> {
        self.oversized.take()
    }

    /// Feeds `input`, appending what passes to `out`.
    pub fn feed(&mut self, mut input: &[u8], out: &mut Vec<u8>) {
        while !input.is_empty() {
            match &mut self.position {
                Position::Header { bytes, have, typed } => {
                    let size = if *typed { 5 } else { 4 };
                    let take = (size - *have).min(input.len());
                    bytes[*have..*have + take].copy_from_slice(&input[..take]);
                    *have += take;
                    input = &input[take..];
                    if *have < size {
                        continue;
                    }
                    let at = size - 4;
                    let length = u32::from_be_bytes([
                        bytes[at],
                        bytes[at + 1],
                        bytes[at + 2],
                        bytes[at + 3],
                    ]) as usize;
                    // A length under 4 is malformed: pgwire's decoder says so.
                    let body = length.saturating_sub(4);
                    if *typed && length > self.max {
                        self.oversized = Some(Oversized {
                            kind: bytes[0],
                            bytes: length,
                        });
                        out.extend_from_slice(&FLUSH);
                        self.position = Position::Skip(body);
                    } else {
                        out.extend_from_slice(&bytes[..size]);
                        self.position = Position::Body(body);
                    }
                }
                Position::Body(left) => {
                    let take = (*left).min(input.len());
                    out.extend_from_slice(&input[..take]);
                    input = &input[take..];
                    *left -= take;
                }
                Position::Skip(left) => {
                    let take = (*left).min(input.len());
                    input = &input[take..];
                    *left -= take;
                }
            }
            // A message ends here (one with an empty body, at its header).
            if matches!(self.position, Position::Body(0) | Position::Skip(0)) {
                self.position = Position::Header {
                    bytes: [0; 5],
                    have: 0,
                    typed: true,
                };
            }
        }
    }
}

/// A client stream whose messages pass through a [`Tracker`].
pub struct Limited<S> {
    inner: S,
    pub tracker: Tracker,
    /// Bytes read from the client, before the tracker.
    scratch: Box<[u8]>,
    /// Bytes the tracker passed, not yet handed up.
    out: Vec<u8>,
    handed: usize,
}

/// How much is read from the client at a time.
const READ_CHUNK: usize = 16 * 1024;

impl<S> Limited<S> {
    pub fn new(inner: S, tracker: Tracker) -> Self {
        Self {
            inner,
            tracker,
            scratch: vec![0; READ_CHUNK].into_boxed_slice(),
            out: Vec::new(),
            handed: 0,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Limited<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.handed < this.out.len() {
                let n = (this.out.len() - this.handed).min(buf.remaining());
                buf.put_slice(&this.out[this.handed..this.handed + n]);
                this.handed += n;
                if this.handed == this.out.len() {
                    this.out.clear();
                    this.handed = 0;
                }
                return Poll::Ready(Ok(()));
            }
            let mut read = ReadBuf::new(&mut this.scratch);
            match Pin::new(&mut this.inner).poll_read(cx, &mut read) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {}
            }
            let filled = read.filled().len();
            if filled == 0 {
                // The end of the stream.
                return Poll::Ready(Ok(()));
            }
            this.tracker.feed(&this.scratch[..filled], &mut this.out);
            // Everything read may have been skipped: read again, as the
            // caller waits for bytes, not for a wake-up.
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Limited<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![kind];
        m.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    fn startup() -> Vec<u8> {
        let mut m = 12u32.to_be_bytes().to_vec();
        m.extend_from_slice(&[0, 3, 0, 0, 0, 0, 0, 0]);
        m
    }

    /// Feeds `stream` in pieces of `piece` bytes.
    fn pass(tracker: &mut Tracker, stream: &[u8], piece: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for chunk in stream.chunks(piece) {
            tracker.feed(chunk, &mut out);
        }
        out
    }

    #[test]
    fn messages_within_the_limit_pass_unchanged_in_any_pieces() {
        let mut stream = startup();
        stream.extend(message(b'Q', b"SELECT 1\0"));
        stream.extend(message(b'S', b""));
        stream.extend(message(b'Q', &[b'x'; 100]));
        for piece in [1, 2, 3, 5, 7, 1000] {
            let mut tracker = Tracker::new(104);
            assert_eq!(
                pass(&mut tracker, &stream, piece),
                stream,
                "pieces of {piece}"
            );
            assert_eq!(tracker.take_oversized(), None);
        }
    }

    #[test]
    fn a_message_over_the_limit_becomes_a_flush_and_the_next_passes() {
        let mut stream = startup();
        stream.extend(message(b'Q', &[b'x'; 1000]));
        stream.extend(message(b'Q', b"SELECT 1\0"));
        for piece in [1, 4, 6, 64, 5000] {
            let mut tracker = Tracker::new(100);
            let out = pass(&mut tracker, &stream, piece);
            let mut expected = startup();
            expected.extend(FLUSH);
            expected.extend(message(b'Q', b"SELECT 1\0"));
            assert_eq!(out, expected, "pieces of {piece}");
            assert_eq!(
                tracker.take_oversized(),
                Some(Oversized {
                    kind: b'Q',
                    bytes: 1004
                })
            );
        }
    }

    #[test]
    fn bytes_already_read_move_the_tracker_on() {
        let mut tracker = Tracker::new(100);
        tracker.skip_read(&startup()[..6]);
        let mut rest = startup()[6..].to_vec();
        rest.extend(message(b'Q', &[b'x'; 200]));
        let out = pass(&mut tracker, &rest, 3);
        let mut expected = startup()[6..].to_vec();
        expected.extend(FLUSH);
        assert_eq!(out, expected);
    }
}
