//! The ledger of units: every unit this host has asked a backend to start,
//! until its removal is confirmed, and how units are removed. Held by the
//! host's services; `units.rs` starts and removes units and tells it.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Every unit this host has asked a backend to start, from the ask until its
/// removal is confirmed. It is what the host names as left when it exits,
/// and what keeps a session (and its place under a session limit) alive
/// until its units are gone.
#[derive(Debug, Default)]
pub struct Ledger {
    units: Mutex<BTreeMap<u64, LeftUnit>>,
    next: AtomicU64,
}

/// A unit the ledger holds: started or starting, not yet confirmed removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeftUnit {
    /// Its session.
    pub session: String,
    /// Its name in the session.
    pub unit: String,
    /// The backend's id, once its start returned it.
    pub id: Option<String>,
}

impl Ledger {
    fn with<R>(&self, change: impl FnOnce(&mut BTreeMap<u64, LeftUnit>) -> R) -> R {
        let mut units = match self.units.lock() {
            Ok(units) => units,
            Err(poisoned) => poisoned.into_inner(),
        };
        change(&mut units)
    }

    /// A start of `unit` of `session` is asked; its key.
    pub fn starting(&self, session: &str, unit: &str) -> u64 {
        let key = self.next.fetch_add(1, Ordering::Relaxed);
        self.with(|units| {
            units.insert(
                key,
                LeftUnit {
                    session: session.to_owned(),
                    unit: unit.to_owned(),
                    id: None,
                },
            )
        });
        key
    }

    /// The start of `key` returned the backend id `id`.
    pub fn started(&self, key: u64, id: &str) {
        self.with(|units| {
            if let Some(unit) = units.get_mut(&key) {
                unit.id = Some(id.to_owned());
            }
        });
    }

    /// The unit of `key` is confirmed gone (removed, or its start undid itself).
    pub fn gone(&self, key: u64) {
        self.with(|units| units.remove(&key));
    }

    /// Every unit not yet confirmed gone.
    pub fn left(&self) -> Vec<LeftUnit> {
        self.with(|units| units.values().cloned().collect())
    }

    /// The units whose start returned an id and that are not yet confirmed gone.
    pub fn tracked(&self) -> Vec<Tracked> {
        self.with(|units| {
            units
                .iter()
                .filter_map(|(key, unit)| unit.id.clone().map(|id| Tracked { key: *key, id }))
                .collect()
        })
    }

    /// The units of `session` not yet confirmed gone.
    pub fn left_of(&self, session: &str) -> Vec<LeftUnit> {
        self.with(|units| {
            units
                .values()
                .filter(|unit| unit.session == session)
                .cloned()
                .collect()
        })
    }
}

impl LeftUnit {
    /// One line naming the unit and how to remove it by hand, for a backend
    /// of `kind` and the host instance `instance`.
    pub fn describe(&self, kind: &str, instance: &str) -> String {
        let session = self.session.get(..12).unwrap_or(&self.session);
        match &self.id {
            None => format!(
                "unit {} of session {session}: its start had not finished (the engine did not answer); once the engine answers, `box gc --instance {instance}` removes it",
                self.unit
            ),
            Some(id) => {
                let how = match kind {
                    "docker" => format!("`docker rm -f {id}`"),
                    "local" => format!("`kill -KILL -- -{id}` (its process group)"),
                    _ => format!("`box gc --instance {instance}`"),
                };
                format!(
                    "unit {} of session {session} ({kind} id {id}): remove it with {how}",
                    self.unit
                )
            }
        }
    }
}

/// A started unit the ledger holds: its key and backend id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tracked {
    /// The ledger's key.
    pub key: u64,
    /// The backend's id.
    pub id: String,
}

/// How units are removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// [`box_backend::Backend::remove`]: what the backend gives a unit's processes first.
    Graceful,
    /// [`box_backend::Backend::remove_now`]: at once, nothing of the unit waited for.
    AtOnce,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_left_unit_is_named_with_how_to_remove_it() {
        let check = |id: Option<&str>, kind: &str, want: &str| {
            let unit = LeftUnit {
                session: "0123456789abcdef".to_owned(),
                unit: "workspace".to_owned(),
                id: id.map(str::to_owned),
            };
            assert_eq!(unit.describe(kind, "http-127.0.0.1-8080"), want);
        };
        check(
            Some("c0ffee"),
            "docker",
            "unit workspace of session 0123456789ab (docker id c0ffee): remove it with `docker rm -f c0ffee`",
        );
        check(
            Some("4242"),
            "local",
            "unit workspace of session 0123456789ab (local id 4242): remove it with `kill -KILL -- -4242` (its process group)",
        );
        check(
            None,
            "docker",
            "unit workspace of session 0123456789ab: its start had not finished (the engine did not answer); once the engine answers, `box gc --instance http-127.0.0.1-8080` removes it",
        );
    }

    #[test]
    fn the_ledger_holds_a_unit_from_its_start_until_it_is_gone() {
        let ledger = Ledger::default();
        let key = ledger.starting("s", "workspace");
        assert_eq!(ledger.left_of("s")[0].id, None);
        assert_eq!(ledger.tracked(), Vec::new());
        ledger.started(key, "id-1");
        assert_eq!(
            ledger.tracked(),
            vec![Tracked {
                key,
                id: "id-1".to_owned()
            }]
        );
        assert_eq!(ledger.left_of("other"), Vec::new());
        ledger.gone(key);
        assert_eq!(ledger.left(), Vec::new());
    }
}
