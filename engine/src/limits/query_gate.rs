//! Which query a piece of model work belongs to, and whether it may go on.
//!
//! A timed-out or interrupted query is cancelled while one of its forward batches
//! may still be running on a blocking thread. With one shared flag, the next query's
//! start used to clear that flag, so the old batch ran on to the end of its operator,
//! on the new query's time and into its counters. Here every query has a number:
//! work checks, between forward batches, that its query is still the current one and
//! not cancelled; and a new query starts only once the previous query's calls have
//! left, which is at most one forward batch after they were told to stop.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::error::{EngineError, Result};

/// The query a call belongs to, taken when the call starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket(u64);

/// Query numbering, cancellation and the hand-over between queries.
#[derive(Debug, Default)]
pub struct QueryGate {
    /// Number of the current query (each start increments it).
    current: AtomicU64,
    /// Queries numbered below this are cancelled.
    cancelled_below: AtomicU64,
    /// Held shared by every call while it runs, exclusively by a query's start.
    in_flight: RwLock<()>,
}

impl QueryGate {
    /// Enters a call: the guard keeps the next query from starting until the call
    /// has returned; the ticket says which query the call's work belongs to.
    pub fn enter(&self) -> (RwLockReadGuard<'_, ()>, Ticket) {
        let guard = self.in_flight.read().unwrap_or_else(|e| e.into_inner());
        (guard, Ticket(self.current.load(Ordering::SeqCst)))
    }

    /// `Ok` while the ticket's query is current and not cancelled; an error naming
    /// the operator otherwise, so the call stops before its next forward batch.
    pub fn check(&self, ticket: Ticket, op_id: &str) -> Result<()> {
        if ticket.0 < self.cancelled_below.load(Ordering::SeqCst) {
            return Err(EngineError::Inference(format!("{op_id}: cancelled")));
        }
        if ticket.0 != self.current.load(Ordering::SeqCst) {
            return Err(EngineError::Inference(format!(
                "{op_id}: cancelled (a newer query has started)"
            )));
        }
        Ok(())
    }

    /// Cancels the current query's work.
    pub fn cancel(&self) {
        let below = self.current.load(Ordering::SeqCst) + 1;
        self.cancelled_below.fetch_max(below, Ordering::SeqCst);
    }

    /// Cancels the work of `ticket`'s query (and of any before it), never of a
    /// later one: a query object cancels itself only.
    pub fn cancel_query(&self, ticket: Ticket) {
        self.cancelled_below
            .fetch_max(ticket.0 + 1, Ordering::SeqCst);
    }

    /// Returns once no call is running: every call entered before has left, and
    /// the cancelled ones leave at their next check.
    pub fn wait_idle(&self) {
        drop(self.in_flight.write().unwrap_or_else(|e| e.into_inner()));
    }

    /// Starts a new query: the previous query's calls stop at their next check, and
    /// this returns once they have all left. Hold the guard while resetting
    /// per-query state.
    pub fn next_query(&self) -> (RwLockWriteGuard<'_, ()>, Ticket) {
        let ticket = Ticket(self.current.fetch_add(1, Ordering::SeqCst) + 1);
        (
            self.in_flight.write().unwrap_or_else(|e| e.into_inner()),
            ticket,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn cancel_stops_the_current_query_only() {
        let gate = QueryGate::default();
        let (guard, t0) = gate.enter();
        gate.check(t0, "filter-1").unwrap();
        gate.cancel();
        let e = gate.check(t0, "filter-1").unwrap_err().to_string();
        assert!(e.contains("filter-1") && e.contains("cancelled"), "{e}");
        drop(guard);
        drop(gate.next_query());
        let (_guard, t1) = gate.enter();
        gate.check(t1, "join-1").unwrap();
        // The old ticket stays stopped, whatever the new query does.
        assert!(gate.check(t0, "filter-1").is_err());
    }

    #[test]
    fn a_new_query_stops_the_old_work_and_waits_for_it_to_leave() {
        let gate = Arc::new(QueryGate::default());
        let (entered_tx, entered_rx) = mpsc::channel();
        let (stopped_tx, stopped_rx) = mpsc::channel();
        let worker = {
            let gate = gate.clone();
            std::thread::spawn(move || {
                let (_guard, ticket) = gate.enter();
                // A first forward batch runs before the new query can start.
                gate.check(ticket, "filter-1").unwrap();
                let mut batches = 1u32;
                entered_tx.send(()).unwrap();
                // Further batches, each after a check, until told to stop.
                while gate.check(ticket, "filter-1").is_ok() {
                    batches += 1;
                    std::thread::sleep(Duration::from_millis(1));
                }
                stopped_tx.send(batches).unwrap();
            })
        };
        entered_rx.recv().unwrap();
        // Without a cancel (the race this gate fixes): the next query's start alone
        // stops the old work, and returns only after the old call has left.
        let (started, _) = gate.next_query();
        let batches = stopped_rx
            .try_recv()
            .expect("the old call had left before the new query started");
        assert!(batches >= 1);
        drop(started);
        worker.join().unwrap();
        let (_guard, ticket) = gate.enter();
        gate.check(ticket, "filter-1").unwrap();
    }
}
