//! Which peers calls skip: a circuit breaker per peer address. Pure: the caller passes
//! the time.
//!
//! A call that cannot reach a peer (connect failure, a connection the keepalive found
//! dead) opens the peer's breaker: calls skip it for [`DOWN_FOR`] and fail over at once —
//! a read to the key's next copy or answered as a miss, a write to the next candidate.
//! After that, **one** call is let through to try the peer (half-open) while every other
//! call keeps failing over: a peer that accepts connections but never answers (a frozen
//! process) holds that one call — at most [`TRY_READ_DEADLINE`] when it is a read, the
//! keepalive timeout otherwise — not every call on the node.
//! (Letting every call try once the second was up stalled a node's whole load for the
//! ~16 s a frozen peer took to leave the ring: ~4 calls/s instead of ~4,000.) An answer
//! from the peer — any answer, an error status too — closes the breaker; a failed try
//! opens it again. A try that reports nothing within [`TRY_STALE_AFTER`] (its caller
//! gave up) lets the next call try.
//!
//! Owns: each peer's breaker state. Must not import tonic, `crate::error`, `flight/` or
//! `cluster/`: the cluster layer (`cluster::peers`) records call outcomes into it.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long calls skip a peer after a call could not reach it.
pub const DOWN_FOR: Duration = Duration::from_secs(1);
/// How long a call trying a peer that was down may go without a verdict before another
/// call may try: the connect timeout (2 s) plus the keepalive's ping and its timeout.
pub const TRY_STALE_AFTER: Duration = Duration::from_secs(4);
/// How long a read that tries a peer that was down waits for the peer to start answering:
/// a peer that is back answers in milliseconds, and the read is a client's, which fails
/// over once this is up instead of waiting out the peer keepalive on a process that
/// still hangs (its kernel accepts the connection).
pub const TRY_READ_DEADLINE: Duration = Duration::from_millis(500);

/// Why a call skips a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// A call could not reach it less than [`DOWN_FOR`] ago.
    Down,
    /// Another call is trying whether it is back.
    Trying,
}

impl Skip {
    /// The reason, for the caller's error message.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Down => "a call just before could not reach it (not tried again for up to 1 s)",
            Self::Trying => {
                "it could not be reached just before, and another call is trying it again"
            }
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Open {
    until: Instant,
    trying_since: Option<Instant>,
}

impl Open {
    /// Why a call at `now` skips this peer: down until `until`, then tried by one call at
    /// a time (until that try reports, or goes stale); none once a call may try it.
    fn skip_at(&self, now: Instant) -> Option<Skip> {
        if now < self.until {
            return Some(Skip::Down);
        }
        match self.trying_since {
            Some(since) if now.saturating_duration_since(since) < TRY_STALE_AFTER => {
                Some(Skip::Trying)
            }
            _ => None,
        }
    }
}

/// The breakers of a node's peers, by address.
#[derive(Debug, Default)]
pub struct PeerHealth {
    open: HashMap<String, Open>,
}

impl PeerHealth {
    /// Whether a call to `address` may go at `now`: `Ok` for a peer not known down, or
    /// for the one call that tries a peer whose down time is over.
    ///
    /// # Errors
    /// [`Skip`] when the call must fail over instead.
    pub fn admit(&mut self, address: &str, now: Instant) -> Result<(), Skip> {
        let Some(open) = self.open.get_mut(address) else {
            return Ok(());
        };
        if let Some(skip) = open.skip_at(now) {
            return Err(skip);
        }
        open.trying_since = Some(now);
        Ok(())
    }

    /// Whether the one call let through to `address` is trying whether it is back: the
    /// caller that was just admitted is that call (every other is skipped meanwhile).
    pub fn trying(&self, address: &str) -> bool {
        self.open
            .get(address)
            .is_some_and(|open| open.trying_since.is_some())
    }

    /// A call could not reach `address`: skipped for [`DOWN_FOR`] from `now`.
    pub fn unreachable(&mut self, address: &str, now: Instant) {
        self.open.insert(
            address.to_owned(),
            Open {
                until: now + DOWN_FOR,
                trying_since: None,
            },
        );
    }

    /// A call to `address` got no answer in its deadline. A slow peer is alive, so this
    /// opens no breaker; but a try of a peer that was down failed: down again.
    pub fn timed_out(&mut self, address: &str, now: Instant) {
        if self.open.contains_key(address) {
            self.unreachable(address, now);
        }
    }

    /// How many peers a call would skip at `now`: down (a call could not reach them less
    /// than [`DOWN_FOR`] ago), or being tried by another call. The node's `stats` report
    /// it, so a check can wait until its calls reach every peer again instead of sleeping.
    pub fn skipped(&self, now: Instant) -> usize {
        self.open
            .values()
            .filter(|open| open.skip_at(now).is_some())
            .count()
    }

    /// `address` answered a call: calls go to it again.
    pub fn answered(&mut self, address: &str) {
        if !self.open.is_empty() {
            self.open.remove(address);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PEER: &str = "n-1:50051";

    #[test]
    fn the_call_let_through_after_a_failure_knows_it_is_trying_the_peer() {
        let mut health = PeerHealth::default();
        let t0 = Instant::now();
        assert!(!health.trying(PEER), "never down");
        health.unreachable(PEER, t0);
        assert!(!health.trying(PEER), "skipped, not tried");
        assert_eq!(health.admit(PEER, t0 + DOWN_FOR), Ok(()));
        assert!(health.trying(PEER));
        health.answered(PEER);
        assert!(!health.trying(PEER), "back: calls as usual");
    }

    #[test]
    fn skipped_counts_the_peers_a_call_would_fail_over_from_now() {
        let mut health = PeerHealth::default();
        let t0 = Instant::now();
        assert_eq!(health.skipped(t0), 0);
        health.unreachable(PEER, t0);
        health.unreachable("n-2:50051", t0);
        assert_eq!(health.skipped(t0), 2, "both down");
        let over = t0 + DOWN_FOR;
        assert_eq!(
            health.skipped(over),
            0,
            "down time over: the next call may go"
        );
        assert_eq!(health.admit(PEER, over), Ok(()));
        assert_eq!(
            health.skipped(over),
            1,
            "one tried: calls skip it meanwhile"
        );
        health.answered(PEER);
        assert_eq!(health.skipped(over), 0, "it answered");
        assert_eq!(health.admit("n-2:50051", over), Ok(()));
        assert_eq!(
            health.skipped(over + TRY_STALE_AFTER),
            0,
            "a try that never reported lets the next call go"
        );
    }

    #[test]
    fn a_peer_never_down_is_always_called() {
        let mut health = PeerHealth::default();
        let now = Instant::now();
        for _ in 0..3 {
            assert_eq!(health.admit(PEER, now), Ok(()));
        }
    }

    #[test]
    fn after_a_failure_calls_skip_the_peer_then_exactly_one_tries_it() {
        let mut health = PeerHealth::default();
        let t0 = Instant::now();
        health.unreachable(PEER, t0);
        assert_eq!(health.admit(PEER, t0), Err(Skip::Down));
        assert_eq!(
            health.admit(PEER, t0 + DOWN_FOR - Duration::from_millis(1)),
            Err(Skip::Down)
        );
        assert_eq!(
            health.admit("n-2:50051", t0),
            Ok(()),
            "other peers are not affected"
        );
        let over = t0 + DOWN_FOR;
        assert_eq!(health.admit(PEER, over), Ok(()), "one call tries");
        for later in [
            over,
            over + Duration::from_secs(1),
            over + TRY_STALE_AFTER - Duration::from_millis(1),
        ] {
            assert_eq!(
                health.admit(PEER, later),
                Err(Skip::Trying),
                "while it tries"
            );
        }
    }

    #[test]
    fn an_answer_closes_the_breaker_and_a_failed_try_opens_it_again() {
        let mut health = PeerHealth::default();
        let t0 = Instant::now();
        health.unreachable(PEER, t0);
        let over = t0 + DOWN_FOR;
        assert_eq!(health.admit(PEER, over), Ok(()));
        health.unreachable(PEER, over + Duration::from_secs(2));
        assert_eq!(
            health.admit(PEER, over + Duration::from_secs(2)),
            Err(Skip::Down)
        );
        let again = over + Duration::from_secs(2) + DOWN_FOR;
        assert_eq!(health.admit(PEER, again), Ok(()));
        health.answered(PEER);
        for _ in 0..3 {
            assert_eq!(health.admit(PEER, again), Ok(()), "closed: every call goes");
        }
    }

    #[test]
    fn a_try_that_times_out_opens_it_again_and_a_timeout_alone_does_not() {
        let mut health = PeerHealth::default();
        let t0 = Instant::now();
        health.timed_out(PEER, t0);
        assert_eq!(health.admit(PEER, t0), Ok(()), "a slow peer is alive");
        health.unreachable(PEER, t0);
        let over = t0 + DOWN_FOR;
        assert_eq!(health.admit(PEER, over), Ok(()));
        health.timed_out(PEER, over + Duration::from_millis(500));
        assert_eq!(
            health.admit(PEER, over + Duration::from_millis(600)),
            Err(Skip::Down)
        );
    }

    #[test]
    fn a_try_without_a_verdict_lets_another_call_try_once_it_is_stale() {
        let mut health = PeerHealth::default();
        let t0 = Instant::now();
        health.unreachable(PEER, t0);
        let over = t0 + DOWN_FOR;
        assert_eq!(health.admit(PEER, over), Ok(()));
        // Its caller gave up (the call was dropped): no verdict ever comes.
        assert_eq!(health.admit(PEER, over + TRY_STALE_AFTER), Ok(()));
        assert_eq!(
            health.admit(PEER, over + TRY_STALE_AFTER),
            Err(Skip::Trying)
        );
    }
}
