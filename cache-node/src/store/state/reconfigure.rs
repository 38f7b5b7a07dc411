//! Live reconfiguration of the locked state: new TTL applied to stored entries,
//! caps shrunk by eviction, puts that no longer fit failed. No I/O.
//!
//! Owns: what a new [`StoreConfig`](crate::store::StoreConfig) does to the state.
//! Imports nothing outside the store.

use std::time::Duration;

use super::Inner;
use crate::store::config::{RemovalCause, StoreConfig};
use crate::store::error::{Error, Result};
use crate::store::eviction::{Incoming, Shares, SlotId};
use crate::store::expiry::compute_deadline;
use crate::store::types::ReconfigureOutcome;

impl Inner {
    /// Applies `config` live; see [`Store::reconfigure`](crate::store::Store::reconfigure).
    pub(crate) fn reconfigure(
        &mut self,
        config: StoreConfig,
        now: Duration,
    ) -> Result<ReconfigureOutcome> {
        config.validate()?;
        let previous = std::mem::replace(&mut self.config, config);
        let mut outcome = ReconfigureOutcome::default();
        if previous.ttl != self.config.ttl || previous.ttl_mode != self.config.ttl_mode {
            outcome.rescheduled_entries = self.recompute_deadlines();
        }
        self.shares = Shares::for_caps(self.config.max_entries, self.config.budget_bytes);
        self.sketch.resize_for(self.config.max_entries);

        let max_entry = self.config.max_entry_bytes;
        if max_entry < previous.max_entry_bytes {
            let too_large: Vec<SlotId> = self
                .index
                .values()
                .copied()
                .filter(|&id| {
                    self.slot(id)
                        .is_some_and(|slot| slot.entry.weight_bytes() > max_entry)
                })
                .collect();
            for id in too_large {
                self.remove_slot(id, RemovalCause::Size);
                outcome.evicted_entries += 1;
            }
            let oversized_puts: Vec<(u64, u64)> = self
                .puts
                .iter()
                .filter(|(_, put)| put.reserved > max_entry)
                .map(|(&id, put)| (id, put.reserved))
                .collect();
            for (id, size) in oversized_puts {
                let _ = self.abort_put(
                    id,
                    Error::EntryTooLarge {
                        size,
                        max: max_entry,
                    },
                );
                outcome.aborted_puts += 1;
            }
        }
        while self.used_bytes + self.reserved_bytes > self.config.budget_bytes
            || self.index.len() as u64 > self.config.max_entries
        {
            match self.evict_one(Incoming::default(), now) {
                Some(RemovalCause::Expired) => outcome.expired_entries += 1,
                Some(_) => outcome.evicted_entries += 1,
                None => break,
            }
        }
        // Only reservations are left over the budget: fail the newest puts.
        while self.reserved_bytes > self.config.budget_bytes {
            let Some((&id, put)) = self
                .puts
                .iter()
                .filter(|(_, put)| put.reserved > 0)
                .max_by_key(|(id, _)| **id)
            else {
                break;
            };
            let needed = put.reserved;
            let available = self
                .config
                .budget_bytes
                .saturating_sub(self.reserved_bytes - needed);
            let _ = self.abort_put(id, Error::OverBudget { needed, available });
            outcome.aborted_puts += 1;
        }
        Ok(outcome)
    }

    /// Applies the current TTL and mode to every stored entry (keeping per-entry
    /// overrides) and rebuilds the expiry index. Returns how many deadlines moved.
    fn recompute_deadlines(&mut self) -> u64 {
        let (mode, ttl) = (self.config.ttl_mode, self.config.ttl);
        let mut moved = 0;
        self.expiry.clear();
        for (id, slot) in self.slots.iter_mut().enumerate() {
            let Some(slot) = slot else { continue };
            let entry_ttl = slot.entry.ttl_override().unwrap_or(ttl);
            let deadline =
                compute_deadline(mode, slot.entry.created_at(), slot.last_access, entry_ttl);
            if deadline != slot.deadline {
                moved += 1;
                slot.deadline = deadline;
                slot.entry.set_expires_at(deadline);
            }
            self.expiry.insert(deadline, id);
        }
        moved
    }
}
