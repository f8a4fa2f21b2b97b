//! The wire between a unit's init and its host: one Unix stream per
//! connection, newline-delimited.
//!
//! Two kinds of line share it, told apart by the first byte: an MCP line is
//! the executor's JSON-RPC and always starts with `{` (or `[`); a control line
//! starts with [`CONTROL_PREFIX`] (`!`) followed by one JSON object with a
//! single key naming the message. MCP lines are relayed as bytes and never
//! parsed; only control lines are.
//!
//! A connection opens with a mutual challenge–response under the unit key,
//! initiated by the init, which connects:
//!
//! ```text
//! init → host  !{"hello":{"version":1,"unit":"U","nonce":"<init nonce>"}}
//! host → init  !{"challenge":{"nonce":"<host nonce>","proof":"<mac(host, init nonce)>"}}
//! init → host  !{"proof":{"mac":"<mac(init, host nonce)>","state":{...}}}
//! host → init  !{"welcome":{}}
//! ```
//!
//! `mac(role, nonce) = HMAC-SHA256(unit key, "box-init/1 " role 0x00 nonce unit)`.
//! The host authenticates the init because any process in the unit can reach
//! the host's socket; the init authenticates the host as well (the brief asked
//! only the former), so that a socket planted where the init connects (a
//! run directory mounted writable by mistake) cannot renew the lease forever.
//! The role in the MAC keeps either side's proof from being reflected as the
//! other's.
//!
//! After `welcome`, the host sends `lease` (renew, fenced by epoch), `release`
//! (it detaches on purpose) and `closeStdin`; the init answers `renewed` or
//! `rejected`, `released` (the last line it writes on that connection), and
//! `ended` (its exit report, the last line of the unit).

use std::time::Duration;

use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

/// The first byte of every control line.
pub const CONTROL_PREFIX: u8 = b'!';

/// The version an init announces in `hello`; a host refuses any other.
pub const PROTOCOL_VERSION: u32 = 1;

/// The environment variable that carries the unit key (64 hex digits) to the
/// init. The init never passes it on to anything it spawns.
pub const KEY_ENV: &str = "BOX_UNIT_KEY";

/// The host's socket, inside the run directory.
pub const SOCKET_NAME: &str = "host.sock";

/// Where the run directory is mounted (read-only) inside a docker unit.
pub const UNIT_RUN_DIR: &str = "/.box/run";

/// The file in the run directory, beside the socket, holding what the image
/// put in the unit's home: the engine's archive of it (a tar whose entries
/// are `./NAME`), which the init unpacks into the unit's home
/// ([`crate::InitConfig::home`]). Absent or empty: nothing to unpack.
pub const HOME_SEED: &str = "home.tar";

/// The longest line either side relays. The executor bounds what it reads
/// (`maxReadBytes`), so a longer line is a fault; it is dropped whole, never
/// relayed in part.
pub const MAX_LINE_BYTES: usize = 64 << 20;

/// The longest control line accepted during the handshake, before the peer is
/// authenticated.
pub const MAX_HANDSHAKE_LINE_BYTES: usize = 4 << 10;

/// Bytes in a nonce and in a unit key.
const SECRET_BYTES: usize = 32;

/// A unit's key: 256 random bits made by the host for one unit, known to the
/// host (and its state file) and to the unit's init only.
#[derive(Clone, PartialEq, Eq)]
pub struct UnitKey([u8; SECRET_BYTES]);

impl UnitKey {
    /// A fresh random key.
    pub fn generate() -> Self {
        Self(rand::random())
    }

    /// The key from its hex form (as in [`KEY_ENV`] or a state file).
    pub fn from_hex(text: &str) -> Result<Self, KeyError> {
        let mut bytes = [0u8; SECRET_BYTES];
        hex::decode_to_slice(text.trim(), &mut bytes).map_err(|_| KeyError {
            length: text.trim().len(),
        })?;
        Ok(Self(bytes))
    }

    /// The key as 64 lower-case hex digits.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    fn mac(&self, role: Role, nonce: &[u8], unit: &str) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
        mac.update(b"box-init/1 ");
        mac.update(role.label());
        mac.update(&[0]);
        mac.update(nonce);
        mac.update(unit.as_bytes());
        mac
    }

    /// The proof that `role` holds this key, for the peer's `nonce` and this
    /// unit: lower-case hex.
    pub fn prove(&self, role: Role, nonce: &Nonce, unit: &str) -> String {
        hex::encode(self.mac(role, &nonce.0, unit).finalize().into_bytes())
    }

    /// Whether `proof` is `role`'s proof for `nonce` and `unit` (constant-time).
    pub fn verify(&self, role: Role, nonce: &Nonce, unit: &str, proof: &str) -> bool {
        let Ok(bytes) = hex::decode(proof) else {
            return false;
        };
        self.mac(role, &nonce.0, unit).verify_slice(&bytes).is_ok()
    }
}

impl std::fmt::Debug for UnitKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UnitKey(..)")
    }
}

/// A unit key that is not 64 hex digits.
#[derive(Debug, thiserror::Error)]
#[error("the unit key must be 64 hex digits (256 bits), got {length} characters")]
pub struct KeyError {
    length: usize,
}

/// Which side proves it holds the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The unit's init.
    Init,
    /// The host.
    Host,
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Role::Init => "unit's init",
            Role::Host => "host",
        })
    }
}

impl Role {
    fn label(self) -> &'static [u8] {
        match self {
            Role::Init => b"init",
            Role::Host => b"host",
        }
    }
}

/// A fresh random challenge.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Nonce([u8; SECRET_BYTES]);

impl Nonce {
    /// A fresh random nonce.
    pub fn generate() -> Self {
        Self(rand::random())
    }

    /// The nonce from its hex form on the wire.
    pub fn from_hex(text: &str) -> Option<Self> {
        let mut bytes = [0u8; SECRET_BYTES];
        hex::decode_to_slice(text, &mut bytes).ok()?;
        Some(Self(bytes))
    }

    /// The nonce as hex, for the wire.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

/// Control messages the host sends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum HostMessage {
    /// The host's answer to `hello`: its own nonce and its proof for the
    /// init's.
    Challenge {
        /// The nonce the init must prove over (hex).
        nonce: String,
        /// The host's proof for the init's nonce (hex).
        proof: String,
    },
    /// The init is authenticated; the relay starts.
    Welcome {},
    /// Renew the lease: the deadline becomes now + `ttl_ms`, unless `epoch` is
    /// below the highest epoch the init has accepted (then `rejected`).
    #[serde(rename_all = "camelCase")]
    Lease {
        /// The lease length from now, in milliseconds.
        ttl_ms: u64,
        /// The renewing host's epoch (a takeover bumps it).
        epoch: u64,
    },
    /// The host detaches on purpose (a handover to a new process): the init
    /// answers `released` after the last whole line it relays on this
    /// connection, then waits for the next one. The lease keeps running.
    Release {},
    /// Close the executor's stdin after the lines already sent (the host's
    /// end of input, like closing a child's stdin).
    CloseStdin {},
}

/// Control messages the init sends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum InitMessage {
    /// The first line on a connection.
    Hello {
        /// [`PROTOCOL_VERSION`].
        version: u32,
        /// The unit identity the init was started with.
        unit: String,
        /// The nonce the host must prove over (hex).
        nonce: String,
    },
    /// The init's proof for the host's nonce, with where the unit stands.
    Proof {
        /// The init's proof (hex).
        mac: String,
        /// The unit's state as the init sees it.
        state: InitState,
    },
    /// A renewal was accepted.
    #[serde(rename_all = "camelCase")]
    Renewed {
        /// The renewal's epoch, now the highest accepted.
        epoch: u64,
        /// Time left on the lease, in milliseconds.
        remaining_ms: u64,
    },
    /// A renewal came from an epoch below the highest accepted: fenced off.
    Rejected {
        /// The renewal's epoch.
        epoch: u64,
        /// The highest epoch accepted.
        current: u64,
    },
    /// The last line the init writes on this connection after `release`.
    Released {},
    /// The unit ends: the init's exit report, the last line it writes.
    Ended(EndReport),
}

/// Where the unit stands, as reported by the init at each handshake.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InitState {
    /// The highest lease epoch accepted so far (0 before any renewal).
    pub epoch: u64,
    /// Time left on the lease, in milliseconds.
    pub lease_remaining_ms: u64,
    /// The executor's process id (as the init sees it).
    pub executor_pid: i32,
    /// The executor's exit, when it has ended (the unit is then ending).
    pub executor_exit: Option<ExitReport>,
    /// Whether the init is PID 1 of a pid namespace.
    pub pid1: bool,
}

impl InitState {
    /// Time left on the lease.
    pub fn lease_remaining(&self) -> Duration {
        Duration::from_millis(self.lease_remaining_ms)
    }
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ExitReport {
    /// It exited with this code.
    Code(i32),
    /// It was killed by this signal number.
    Signal(i32),
}

impl std::fmt::Display for ExitReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExitReport::Code(code) => write!(f, "exit code {code}"),
            ExitReport::Signal(signal) => write!(f, "killed by {}", signal_name(*signal)),
        }
    }
}

/// A signal number as people know it: `SIGKILL`, else `signal 64`.
pub fn signal_name(signal: i32) -> String {
    nix::sys::signal::Signal::try_from(signal).map_or_else(
        |_| format!("signal {signal}"),
        |known| known.as_str().to_owned(),
    )
}

/// A control message's kind, as the wire names it (`released`), for a log
/// line: never its fields, which hold nonces and proofs.
pub fn kind_of<T: Serialize>(message: &T) -> String {
    match serde_json::to_value(message) {
        Ok(serde_json::Value::Object(object)) => object.keys().next().cloned().unwrap_or_default(),
        Ok(serde_json::Value::String(name)) => name,
        _ => String::new(),
    }
}

impl ExitReport {
    /// The shell's convention: the code, or 128 + the signal number.
    pub fn as_exit_code(self) -> i32 {
        match self {
            ExitReport::Code(code) => code,
            ExitReport::Signal(signal) => 128 + signal,
        }
    }
}

/// Why a unit ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum EndReason {
    /// The executor exited on its own.
    ExecutorExited,
    /// No renewal arrived before the lease's deadline.
    LeaseLapsed,
    /// The init was asked to stop (SIGTERM or SIGINT, e.g. `docker stop`).
    Terminated,
}

impl std::fmt::Display for EndReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            EndReason::ExecutorExited => "its executor exited",
            EndReason::LeaseLapsed => "its lease lapsed",
            EndReason::Terminated => "it was asked to stop",
        })
    }
}

/// The init's exit report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EndReport {
    /// Why the unit ended.
    pub reason: EndReason,
    /// How the executor ended, when it did before the init.
    pub executor: Option<ExitReport>,
    /// How many other processes the init killed on the way out.
    pub killed: u32,
    /// The init's own exit code.
    pub exit_code: i32,
}

/// Whether `line` is a control line.
pub fn is_control(line: &[u8]) -> bool {
    line.first() == Some(&CONTROL_PREFIX)
}

/// `message` as a control line: `!`, the JSON, `\n`.
pub fn encode_control<T: Serialize>(message: &T) -> Vec<u8> {
    let mut line = vec![CONTROL_PREFIX];
    // Serializing these plain enums into a Vec cannot fail.
    if serde_json::to_writer(&mut line, message).is_err() {
        unreachable!("control messages always serialize");
    }
    line.push(b'\n');
    line
}

/// A control line (with or without its newline) as a message.
pub fn parse_control<T: for<'de> Deserialize<'de>>(line: &[u8]) -> Result<T, ControlError> {
    let body = line
        .strip_prefix(&[CONTROL_PREFIX])
        .ok_or(ControlError::NotControl)?;
    let body = body.strip_suffix(b"\n").unwrap_or(body);
    serde_json::from_slice(body).map_err(ControlError::Json)
}

/// A control line that does not parse.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The line does not start with `!`.
    #[error("not a control line (control lines start with `!`)")]
    NotControl,
    /// The JSON after `!` is not a known message.
    #[error("malformed control line: {0}")]
    Json(serde_json::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ends_and_messages_are_told_in_words_never_debug_text() {
        assert_eq!(ExitReport::Code(2).to_string(), "exit code 2");
        assert_eq!(ExitReport::Signal(9).to_string(), "killed by SIGKILL");
        assert_eq!(ExitReport::Signal(99).to_string(), "killed by signal 99");
        assert_eq!(EndReason::LeaseLapsed.to_string(), "its lease lapsed");
        assert_eq!(Role::Host.to_string(), "host");
        assert_eq!(kind_of(&InitMessage::Released {}), "released");
    }

    #[test]
    fn a_proof_verifies_only_for_its_role_nonce_unit_and_key() {
        let key = UnitKey::generate();
        let nonce = Nonce::generate();
        let proof = key.prove(Role::Init, &nonce, "unit-a");
        assert!(key.verify(Role::Init, &nonce, "unit-a", &proof));
        assert!(
            !key.verify(Role::Host, &nonce, "unit-a", &proof),
            "reflected"
        );
        assert!(!key.verify(Role::Init, &Nonce::generate(), "unit-a", &proof));
        assert!(!key.verify(Role::Init, &nonce, "unit-b", &proof));
        assert!(!UnitKey::generate().verify(Role::Init, &nonce, "unit-a", &proof));
        assert!(!key.verify(Role::Init, &nonce, "unit-a", "zz"));
        assert!(!key.verify(Role::Init, &nonce, "unit-a", ""));
    }

    #[test]
    fn a_key_round_trips_through_hex_and_rejects_other_lengths() {
        let key = UnitKey::generate();
        assert_eq!(UnitKey::from_hex(&key.to_hex()).ok(), Some(key.clone()));
        assert_eq!(key.to_hex().len(), 64);
        let error = UnitKey::from_hex("abcd").err().map(|e| e.to_string());
        assert_eq!(
            error.as_deref(),
            Some("the unit key must be 64 hex digits (256 bits), got 4 characters")
        );
        assert!(UnitKey::from_hex(&"g".repeat(64)).is_err());
        assert_eq!(format!("{key:?}"), "UnitKey(..)");
    }

    #[test]
    fn control_lines_have_the_documented_shape() {
        let check = |message: HostMessage, expected: &str| {
            let line = encode_control(&message);
            assert_eq!(String::from_utf8_lossy(&line), format!("{expected}\n"));
            assert!(is_control(&line));
            assert_eq!(parse_control::<HostMessage>(&line).ok(), Some(message));
        };
        check(
            HostMessage::Lease {
                ttl_ms: 30000,
                epoch: 3,
            },
            r#"!{"lease":{"ttlMs":30000,"epoch":3}}"#,
        );
        check(HostMessage::Release {}, r#"!{"release":{}}"#);
        check(HostMessage::CloseStdin {}, r#"!{"closeStdin":{}}"#);

        let ended = InitMessage::Ended(EndReport {
            reason: EndReason::LeaseLapsed,
            executor: Some(ExitReport::Signal(9)),
            killed: 2,
            exit_code: 75,
        });
        assert_eq!(
            String::from_utf8_lossy(&encode_control(&ended)),
            "!{\"ended\":{\"reason\":\"leaseLapsed\",\"executor\":{\"signal\":9},\"killed\":2,\"exitCode\":75}}\n"
        );
    }

    #[test]
    fn malformed_and_foreign_control_lines_are_errors() {
        let check = |line: &[u8], expected: &str| {
            let error = parse_control::<HostMessage>(line)
                .err()
                .map(|e| e.to_string());
            assert!(
                error.as_deref().is_some_and(|e| e.starts_with(expected)),
                "{:?}: {error:?}",
                String::from_utf8_lossy(line)
            );
        };
        check(b"{\"jsonrpc\":\"2.0\"}\n", "not a control line");
        check(b"!{\"lease\":{\"ttlMs\":1}}\n", "malformed control line");
        check(
            b"!{\"lease\":{\"ttlMs\":1,\"epoch\":1,\"x\":2}}\n",
            "malformed",
        );
        check(
            b"!{\"renewed\":{\"epoch\":1,\"remainingMs\":1}}\n",
            "malformed",
        );
        check(b"!not json\n", "malformed control line");
        check(b"", "not a control line");
        assert!(!is_control(b"{\"jsonrpc\":\"2.0\"}\n"));
        assert!(!is_control(b""));
    }
}
