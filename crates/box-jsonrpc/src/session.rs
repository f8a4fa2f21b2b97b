//! The channel between a transport and a session: what a transport holds
//! ([`SessionHandle`]) and what the session receives ([`Inbound`]). Here, not
//! in the host, because it knows nothing of units or profiles, and both sides
//! (the host's session task, the transports) must agree on it without knowing
//! each other.

use std::sync::{Arc, OnceLock};

use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::{ReplyStream, ReplyTo, reply_channel};

/// The most bytes one part of a [`TransportAsk`] may hold (a `Box-Tighten`
/// header, `box serve --tighten`): a tightening is a few hundred bytes, and
/// a header several times that is a mistake or an attack, not an ask.
pub const MAX_ASK_BYTES: usize = 8 << 10;

/// What a session asks through its transport rather than `initialize`'s
/// capabilities (generic MCP clients cannot send those): over HTTP the
/// `/mcp/p/{profile}` path and the `Box-*` headers, over stdio `box serve`'s
/// flags. Raw text: the host parses and checks it as it checks a capability
/// ask, and merges the two (they must agree where both give a field).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TransportAsk {
    /// The profile's name.
    pub profile: Option<AskPart>,
    /// The tightening, as JSON text.
    pub tighten: Option<AskPart>,
    /// The read limit, as decimal text.
    pub max_read_bytes: Option<AskPart>,
    /// The session to reattach to, `SESSION:SECRET` (HTTP's `Box-Reattach`;
    /// read at initialize only).
    pub reattach: Option<AskPart>,
}

impl TransportAsk {
    /// Whether nothing was asked.
    pub fn is_empty(&self) -> bool {
        self.profile.is_none()
            && self.tighten.is_none()
            && self.max_read_bytes.is_none()
            && self.reattach.is_none()
    }
}

/// One part of a [`TransportAsk`]: its text and where it came from, which
/// errors name (`the Box-Tighten header`, `the path /mcp/p/ci`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AskPart {
    /// The text as sent.
    pub text: String,
    /// Where it was sent, for errors.
    pub source: String,
}

impl AskPart {
    /// `text` from `source`.
    pub fn new(text: impl Into<String>, source: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            source: source.into(),
        }
    }
}

/// A message from the client to a session.
#[derive(Debug)]
pub enum Inbound {
    /// A request and where its answer goes.
    Request(Value, ReplyTo),
    /// A notification, or a response to a server→client request.
    Other(Value),
}

/// The session is gone: it ended, or never started.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the session has ended")]
pub struct SessionGone;

/// A handle on a running session; cloning shares it.
#[derive(Debug, Clone)]
pub struct SessionHandle {
    id: String,
    inbound: mpsc::Sender<Inbound>,
    cancel: CancellationToken,
    done: CancellationToken,
    opened: CancellationToken,
    version: Arc<OnceLock<&'static str>>,
}

impl SessionHandle {
    /// A handle on the session that reads `inbound`'s other end: `cancel`
    /// asks it to end, it cancels `done` once it has ended (its units
    /// removed), `opened` once a way in opened it, and it sets `version` at
    /// a successful initialize.
    pub fn new(
        id: String,
        inbound: mpsc::Sender<Inbound>,
        cancel: CancellationToken,
        done: CancellationToken,
        opened: CancellationToken,
        version: Arc<OnceLock<&'static str>>,
    ) -> Self {
        Self {
            id,
            inbound,
            cancel,
            done,
            opened,
            version,
        }
    }

    /// The session's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Send a request; its answer (and what streams before it) come on the returned stream.
    pub async fn request(&self, message: Value) -> Result<ReplyStream, SessionGone> {
        let (reply, stream) = reply_channel();
        self.inbound
            .send(Inbound::Request(message, reply))
            .await
            .map_err(|_| SessionGone)?;
        Ok(stream)
    }

    /// Send a notification or a response.
    pub async fn notify(&self, message: Value) -> Result<(), SessionGone> {
        self.inbound
            .send(Inbound::Other(message))
            .await
            .map_err(|_| SessionGone)
    }

    /// Ask the session to end (its units are then removed).
    pub fn end(&self) {
        self.cancel.cancel();
    }

    /// Resolves once the session has ended and its units are removed.
    pub async fn ended(&self) {
        self.done.cancelled().await;
    }

    /// Whether the session has ended.
    pub fn has_ended(&self) -> bool {
        self.done.is_cancelled()
    }

    /// Resolves once a way in opened the session (its units started, or
    /// reattached), before the request it was opened for is served; never
    /// for a session refused at every way in.
    pub async fn opened(&self) {
        self.opened.cancelled().await;
    }

    /// The protocol version `initialize` agreed to; `None` before a successful
    /// initialize. It governs what the transport accepts afterwards
    /// (`MCP-Protocol-Version`, batches).
    pub fn protocol_version(&self) -> Option<&'static str> {
        self.version.get().copied()
    }
}
