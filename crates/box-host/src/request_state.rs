//! The `requestState` of MCP 2026-07-28's "input required" answer (MRTR):
//! what a session needs to route a client's retry back to the call waiting
//! in its unit. The client holds it between the two requests and may send
//! it back changed, so it is attacker-controlled on the way back: a state
//! is trusted only when its MAC verifies (HMAC-SHA256 under a key this host
//! minted at start and never writes anywhere), and the session then checks
//! it names that session, the call and the round waiting, before its time
//! to live ran out. Pure but for the clock the caller reads.
//!
//! Its form is `box1.SESSION.PAYLOAD.MAC`: the session id in the clear, as
//! a handle's id is, so a transport can route a retry by it; the payload
//! (base64url JSON) and the MAC over everything before it.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

/// How long a client has to answer a unit's request for input: after it,
/// the state is refused and the call waiting for it is cancelled.
pub const INPUT_TTL: Duration = Duration::from_secs(600);

/// The form's first part: a later form can be told apart.
const FORM: &str = "box1";

/// The host's key for request states: random per host and never persisted,
/// so a restarted host refuses its predecessor's states (the calls they
/// continued were not carried over).
pub struct StateKey([u8; 32]);

impl StateKey {
    /// A fresh key.
    pub fn random() -> Self {
        Self(rand::random())
    }

    fn mac(&self, message: &[u8]) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
        mac.update(message);
        mac
    }
}

impl std::fmt::Debug for StateKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StateKey(..)")
    }
}

/// What a request state binds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestState {
    /// The box session it was minted in (a handle's id).
    #[serde(rename = "s")]
    pub session: String,
    /// The unit the call waits in.
    #[serde(rename = "u")]
    pub unit: usize,
    /// The call's id at that unit.
    #[serde(rename = "c")]
    pub call: u64,
    /// Which round of input it answers: a state serves one round, once.
    #[serde(rename = "r")]
    pub round: u64,
    /// The keys of the round's input requests, which the retry answers.
    #[serde(rename = "k")]
    pub keys: Vec<String>,
    /// The call's method and name (a tool's name, a resource's URI, a
    /// prompt's name): the retry must be the same request.
    #[serde(rename = "m")]
    pub method: String,
    #[serde(rename = "n")]
    pub name: String,
    /// Unix seconds after which it is refused.
    #[serde(rename = "e")]
    pub expires: u64,
}

/// Now, in Unix seconds.
pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs())
}

/// `state` sealed under `key`.
pub fn seal(key: &StateKey, state: &RequestState) -> String {
    let payload = URL_SAFE_NO_PAD.encode(serde_json::to_vec(state).unwrap_or_default());
    let signed = format!("{FORM}.{}.{payload}", state.session);
    let mac = URL_SAFE_NO_PAD.encode(key.mac(signed.as_bytes()).finalize().into_bytes());
    format!("{signed}.{mac}")
}

/// The session a sealed state names (not verified: a transport routes by
/// it, the session verifies).
pub fn session_of(text: &str) -> Option<&str> {
    let mut parts = text.split('.');
    (parts.next() == Some(FORM)).then(|| parts.next()).flatten()
}

/// The state `text` seals, when `key` sealed it and it has not expired at
/// `now` (Unix seconds); else why not, for the client.
pub fn open(key: &StateKey, text: &str, now: u64) -> Result<RequestState, String> {
    let foreign = || "it is not a request state box minted".to_owned();
    let (signed, mac) = text.rsplit_once('.').ok_or_else(foreign)?;
    let mac = URL_SAFE_NO_PAD.decode(mac).map_err(|_| foreign())?;
    key.mac(signed.as_bytes()).verify_slice(&mac).map_err(|_| {
        "its seal does not verify: it was changed, or another host (or this one before a restart) minted it".to_owned()
    })?;
    let mut parts = signed.splitn(3, '.');
    let (Some(FORM), Some(session), Some(payload)) = (parts.next(), parts.next(), parts.next())
    else {
        return Err(foreign());
    };
    let state: RequestState = URL_SAFE_NO_PAD
        .decode(payload)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .ok_or_else(foreign)?;
    if state.session != session {
        return Err(foreign());
    }
    if now > state.expires {
        return Err(format!(
            "it expired {}s ago (a client has {}s to answer a request for input)",
            now - state.expires,
            INPUT_TTL.as_secs()
        ));
    }
    Ok(state)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn state() -> RequestState {
        RequestState {
            session: "s1".to_owned(),
            unit: 0,
            call: 7,
            round: 1,
            keys: vec!["box-1".to_owned()],
            method: "tools/call".to_owned(),
            name: "ask".to_owned(),
            expires: 1_000,
        }
    }

    #[test]
    fn a_state_opens_under_its_key_until_it_expires() {
        let key = StateKey::random();
        let sealed = seal(&key, &state());
        assert_eq!(session_of(&sealed), Some("s1"));
        assert_eq!(open(&key, &sealed, 1_000), Ok(state()));
        let expired = open(&key, &sealed, 1_030).unwrap_err();
        assert!(expired.contains("expired 30s ago"), "{expired}");
        let other = open(&StateKey::random(), &sealed, 0).unwrap_err();
        assert!(other.contains("does not verify"), "{other}");
    }

    #[test]
    fn a_changed_state_is_refused() {
        let key = StateKey::random();
        let sealed = seal(&key, &state());
        // Another session's id in the clear, the payload's unchanged.
        let renamed = sealed.replacen(".s1.", ".s2.", 1);
        assert!(
            open(&key, &renamed, 0)
                .unwrap_err()
                .contains("does not verify")
        );
        // A longer life, resealed without the key.
        let mut longer = state();
        longer.expires = u64::MAX;
        let forged = seal(&StateKey::random(), &longer);
        let (forged_body, _) = forged.rsplit_once('.').unwrap();
        let (_, mac) = sealed.rsplit_once('.').unwrap();
        assert!(
            open(&key, &format!("{forged_body}.{mac}"), 0)
                .unwrap_err()
                .contains("does not verify")
        );
        for junk in ["", "box1", "x.y.z", "box1.s1.e30.AAAA"] {
            assert!(open(&key, junk, 0).is_err(), "{junk}");
        }
    }
}
