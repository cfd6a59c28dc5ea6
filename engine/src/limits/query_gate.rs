//! One query's stop signal for its model work: [`Ticket`].
//!
//! A timed-out or interrupted query is cancelled while one of its forward
//! batches may still be running on a blocking thread. Every query has its own
//! ticket: its work checks, between forward batches, that the ticket is not
//! cancelled, and whoever cancels it can wait for its calls to leave (at most
//! one forward batch after they were told to stop). Cancelling one query never
//! touches another's work, and a new query's start stops nothing: several
//! queries run on one backend at once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{RwLock, RwLockReadGuard};

use crate::error::{EngineError, Result};

/// One query's right to run model work.
#[derive(Debug, Default)]
pub struct Ticket {
    cancelled: AtomicBool,
    /// Held shared by each of the query's calls while it runs; exclusively
    /// by [`Self::wait_idle`].
    in_flight: RwLock<()>,
}

impl Ticket {
    /// Enters a call: [`Self::wait_idle`] returns only after the guard is dropped.
    pub fn enter(&self) -> RwLockReadGuard<'_, ()> {
        self.in_flight.read().unwrap_or_else(|e| e.into_inner())
    }

    /// `Ok` while the query is not cancelled; an error naming the operator
    /// otherwise, so the call stops before its next forward batch.
    pub fn check(&self, op_id: &str) -> Result<()> {
        if self.cancelled.load(Ordering::SeqCst) {
            return Err(EngineError::Inference(format!("{op_id}: cancelled")));
        }
        Ok(())
    }

    /// Cancels the query's work: its calls stop at their next check.
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::SeqCst);
    }

    /// Returns once none of the query's calls is running: every call entered
    /// before has left (the cancelled ones leave at their next check).
    pub fn wait_idle(&self) {
        drop(self.in_flight.write().unwrap_or_else(|e| e.into_inner()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn cancel_stops_its_own_query_only() {
        let (first, second) = (Ticket::default(), Ticket::default());
        let guard = first.enter();
        first.check("filter-1").unwrap();
        first.cancel();
        let e = first.check("filter-1").unwrap_err().to_string();
        assert!(e.contains("filter-1") && e.contains("cancelled"), "{e}");
        drop(guard);
        first.wait_idle();
        let _guard = second.enter();
        second.check("join-1").unwrap();
        assert!(first.check("filter-1").is_err());
    }

    #[test]
    fn waiting_for_a_cancelled_query_returns_once_its_call_has_left() {
        let ticket = Arc::new(Ticket::default());
        let (entered_tx, entered_rx) = mpsc::channel();
        let (stopped_tx, stopped_rx) = mpsc::channel();
        let worker = {
            let ticket = ticket.clone();
            std::thread::spawn(move || {
                let _guard = ticket.enter();
                ticket.check("filter-1").unwrap();
                let mut batches = 1u32;
                entered_tx.send(()).unwrap();
                while ticket.check("filter-1").is_ok() {
                    batches += 1;
                    std::thread::sleep(Duration::from_millis(1));
                }
                stopped_tx.send(batches).unwrap();
            })
        };
        entered_rx.recv().unwrap();
        ticket.cancel();
        ticket.wait_idle();
        let batches = stopped_rx
            .try_recv()
            .expect("the call had left before wait_idle returned");
        assert!(batches >= 1);
        worker.join().unwrap();
    }
}
