//! The routing tables of one session: which unit request answers which client
//! request, which client token a unit's progress belongs to, which unit a
//! server→client request came from.
//!
//! The router decides where a unit's message goes and never sends it there:
//! every message for the client comes back to the session ([`UnitMessage`]),
//! which redacts it first (`redact.rs`), so nothing a unit says reaches a
//! client's stream unredacted.

use std::collections::{BTreeMap, HashMap};

use serde_json::{Value, json};
use tokio::sync::mpsc;

use box_jsonrpc::{Kind, ReplyTo, classify, id_key, params, params_mut};

/// A unit's request id: the router numbers each unit's requests itself, so two
/// clients (or two sessions' worth of ids) never collide upstream.
pub type UnitRequestId = u64;

/// One forwarded client request waiting for its unit's answer.
#[derive(Debug)]
pub struct Forward<T> {
    /// The client's id, exactly as sent (type included).
    pub client_id: Value,
    /// Where the answer goes.
    pub reply: ReplyTo,
    /// The client's progress token, exactly as sent, when it gave one.
    pub progress_token: Option<Value>,
    /// What the caller keeps with the request (method, timers, rewrites).
    pub tag: T,
}

/// What a message from a unit amounts to, once routed.
#[derive(Debug)]
pub enum UnitMessage<T> {
    /// The answer to a forwarded request, its id already the client's.
    Answer {
        /// The request it answers.
        forward: Forward<T>,
        /// The response, ready for the client.
        response: Value,
    },
    /// A message for the client that belongs to no request (or whose request
    /// is gone): logs, list changes, a server→client request made between calls.
    General(Value),
    /// A message for the client that belongs to a request in flight (its
    /// progress, a server→client request made during the call): to be put on
    /// that request's stream once redacted.
    Related {
        /// The request's stream (over HTTP, the call's SSE response).
        stream: mpsc::Sender<Value>,
        /// The message, its ids already the client's.
        message: Value,
        /// What becomes of it when the stream cannot take it.
        when_full: WhenFull,
        /// For a request of the client: the call it was made during (the
        /// unit's id of it), which a stateless call may answer with it.
        during: Option<UnitRequestId>,
    },
    /// Nothing more to do: the message was stale (an answer to a cancelled
    /// request, progress for a finished one) and was dropped.
    Done,
    /// Not a JSON-RPC message; the unit is misbehaving.
    Invalid(String),
    /// An answer to send back to the unit (its request was refused).
    Refuse(Value),
}

/// What becomes of a [`UnitMessage::Related`] message its request's stream
/// cannot take (a client that does not read, a stream already closed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenFull {
    /// Dropped: progress is lossy by design (a client that does not read
    /// loses updates, not calls).
    Drop,
    /// Sent as a general message instead: a request must reach the client.
    General,
}

/// The most server→client requests of one session waiting for the client's answers.
pub const MAX_SERVER_REQUESTS: usize = 64;

#[derive(Debug, Default)]
struct UnitTable<T> {
    next_id: UnitRequestId,
    pending: BTreeMap<UnitRequestId, Forward<T>>,
}

/// The routing state of one session.
#[derive(Debug)]
pub struct Router<T> {
    units: Vec<UnitTable<T>>,
    /// Client id key → (unit, unit request id), for the client's cancellations.
    by_client_id: HashMap<String, (usize, UnitRequestId)>,
    /// Proxy-assigned id key → (unit, the unit's own id), for server→client requests.
    server_requests: HashMap<String, (usize, Value)>,
    next_server_request: u64,
}

impl<T> Router<T> {
    /// A router for `units` units; each unit's request ids start at `first_id`.
    pub fn new(units: usize, first_id: UnitRequestId) -> Self {
        Self {
            units: (0..units)
                .map(|_| UnitTable {
                    next_id: first_id,
                    pending: BTreeMap::new(),
                })
                .collect(),
            by_client_id: HashMap::new(),
            server_requests: HashMap::new(),
            next_server_request: 1,
        }
    }

    /// Add a unit during the session (a fork, a server started later); its
    /// request ids start at `first_id`. Returns its index, which no other
    /// unit ever had: a removed unit's index is not reused, so a late answer
    /// from it can never reach another unit's requests.
    pub fn add_unit(&mut self, first_id: UnitRequestId) -> usize {
        self.units.push(UnitTable {
            next_id: first_id,
            pending: BTreeMap::new(),
        });
        self.units.len() - 1
    }

    /// Remove a unit during the session: every request in flight to it is
    /// handed back to be answered (as [`Router::take_all`]); later messages
    /// from it route nowhere.
    pub fn remove_unit(&mut self, unit: usize) -> Vec<Forward<T>> {
        self.take_all(unit)
    }

    /// Whether a request with this client id is in flight (ids must not be reused while they are).
    pub fn is_in_flight(&self, client_id: &Value) -> bool {
        self.by_client_id.contains_key(&id_key(client_id))
    }

    /// How many client requests are in flight, across units.
    pub fn in_flight(&self) -> usize {
        self.units.iter().map(|unit| unit.pending.len()).sum()
    }

    /// Rewrite the client request `message` for `unit`: a fresh id, a fresh
    /// progress token; record where its answer goes. Returns the unit's id and
    /// the message to send it.
    pub fn forward(
        &mut self,
        unit: usize,
        mut message: Value,
        reply: ReplyTo,
        tag: T,
    ) -> (UnitRequestId, Value) {
        let table = &mut self.units[unit];
        let unit_id = table.next_id;
        table.next_id += 1;
        let client_id = message.get("id").cloned().unwrap_or(Value::Null);
        if let Some(object) = message.as_object_mut() {
            object.insert("id".to_owned(), json!(unit_id));
        }
        // The unit's token is its request id: unique among the unit's active
        // requests, which is all the protocol asks of a token.
        // Only a token the client gave is replaced; nothing is added to a message.
        let progress_token = message
            .get_mut("params")
            .and_then(|params| params.get_mut("_meta"))
            .and_then(|meta| meta.get_mut("progressToken"))
            .map(|token| std::mem::replace(token, json!(unit_id)));
        self.by_client_id
            .insert(id_key(&client_id), (unit, unit_id));
        table.pending.insert(
            unit_id,
            Forward {
                client_id,
                reply,
                progress_token,
                tag,
            },
        );
        (unit_id, message)
    }

    /// Take a forwarded request back unanswered (deadline, cancellation, unit gone).
    pub fn take(&mut self, unit: usize, unit_id: UnitRequestId) -> Option<Forward<T>> {
        let forward = self.units.get_mut(unit)?.pending.remove(&unit_id)?;
        self.by_client_id.remove(&id_key(&forward.client_id));
        Some(forward)
    }

    /// Take every request in flight to `unit` (it ended).
    pub fn take_all(&mut self, unit: usize) -> Vec<Forward<T>> {
        let Some(table) = self.units.get_mut(unit) else {
            return Vec::new();
        };
        let taken: Vec<_> = std::mem::take(&mut table.pending).into_values().collect();
        for forward in &taken {
            self.by_client_id.remove(&id_key(&forward.client_id));
        }
        self.server_requests.retain(|_, (owner, _)| *owner != unit);
        taken
    }

    /// The tag of a request in flight.
    pub fn tag(&self, unit: usize, unit_id: UnitRequestId) -> Option<&T> {
        Some(&self.units.get(unit)?.pending.get(&unit_id)?.tag)
    }

    /// The tag of a request in flight, to change.
    pub fn tag_mut(&mut self, unit: usize, unit_id: UnitRequestId) -> Option<&mut T> {
        Some(&mut self.units.get_mut(unit)?.pending.get_mut(&unit_id)?.tag)
    }

    /// Take a forwarded request's client away while it waits in its unit
    /// (a stateless call answered "input required"): its client id and
    /// reply, to answer now; the call stays in flight, with a reply that
    /// reaches no one until [`Router::resume`] gives it the retry's.
    pub fn park(&mut self, unit: usize, unit_id: UnitRequestId) -> Option<(Value, ReplyTo)> {
        let forward = self.units.get_mut(unit)?.pending.get_mut(&unit_id)?;
        let (nowhere, _) = box_jsonrpc::reply_channel();
        let reply = std::mem::replace(&mut forward.reply, nowhere);
        let client_id = std::mem::replace(&mut forward.client_id, Value::Null);
        forward.progress_token = None;
        self.by_client_id.remove(&id_key(&client_id));
        Some((client_id, reply))
    }

    /// Give a parked request ([`Router::park`]) the client request that
    /// continues it: its id, reply and progress token. The reply back when
    /// the request is no longer in flight.
    pub fn resume(
        &mut self,
        unit: usize,
        unit_id: UnitRequestId,
        client_id: Value,
        reply: ReplyTo,
        progress_token: Option<Value>,
    ) -> Result<(), ReplyTo> {
        let Some(forward) = self
            .units
            .get_mut(unit)
            .and_then(|table| table.pending.get_mut(&unit_id))
        else {
            return Err(reply);
        };
        self.by_client_id
            .insert(id_key(&client_id), (unit, unit_id));
        forward.client_id = client_id;
        forward.reply = reply;
        forward.progress_token = progress_token;
        Ok(())
    }

    /// Forget the unit's request the client would answer under `proxy_id`
    /// (its call ended before the client answered it).
    pub fn forget_server_request(&mut self, proxy_id: &Value) {
        self.server_requests.remove(&id_key(proxy_id));
    }

    /// Whether the unit's request the client would answer under `proxy_id`
    /// waits for that answer.
    pub fn server_request_waits(&self, proxy_id: &Value) -> bool {
        self.server_requests.contains_key(&id_key(proxy_id))
    }

    /// Translate the client's `notifications/cancelled`: the unit to tell and
    /// the notification in its id space, and the request it cancels (taken:
    /// the client expects no answer). `None` for an unknown or finished id.
    pub fn client_cancel(&mut self, mut message: Value) -> Option<(usize, Value, Forward<T>)> {
        let request_id = params(&message)?.get("requestId")?.clone();
        let (unit, unit_id) = *self.by_client_id.get(&id_key(&request_id))?;
        let forward = self.take(unit, unit_id)?;
        params_mut(&mut message)?.insert("requestId".to_owned(), json!(unit_id));
        Some((unit, message, forward))
    }

    /// Translate the client's answer to a server→client request: the unit it
    /// goes to and the answer with the unit's own id. `None` for an unknown id.
    pub fn client_response(&mut self, mut message: Value) -> Option<(usize, Value)> {
        let id = message.get("id")?;
        let (unit, unit_id) = self.server_requests.remove(&id_key(id))?;
        message.as_object_mut()?.insert("id".to_owned(), unit_id);
        Some((unit, message))
    }

    /// Route a message the unit `unit` sent.
    pub fn from_unit(&mut self, unit: usize, mut message: Value) -> UnitMessage<T> {
        let kind = match classify(&message) {
            Ok(kind) => kind,
            Err(error) => return UnitMessage::Invalid(error.to_string()),
        };
        match kind {
            Kind::Response { id } => {
                let Some(unit_id) = id.as_u64() else {
                    return UnitMessage::Done;
                };
                let Some(forward) = self.take(unit, unit_id) else {
                    // An answer that crossed a cancel or a deadline: the client
                    // already had its one answer.
                    return UnitMessage::Done;
                };
                if let Some(object) = message.as_object_mut() {
                    object.insert("id".to_owned(), forward.client_id.clone());
                }
                UnitMessage::Answer {
                    forward,
                    response: message,
                }
            }
            Kind::Request { id, method } => {
                if self.server_requests.len() >= MAX_SERVER_REQUESTS {
                    // The executor is untrusted: it may not flood the client or grow this table.
                    return UnitMessage::Refuse(box_jsonrpc::error_response(
                        id,
                        box_jsonrpc::code::INTERNAL_ERROR,
                        format!(
                            "{method}: {MAX_SERVER_REQUESTS} requests to the client are already waiting for answers"
                        ),
                    ));
                }
                let proxy_id = json!(format!("box-{}", self.next_server_request));
                self.next_server_request += 1;
                self.server_requests.insert(id_key(&proxy_id), (unit, id));
                if let Some(object) = message.as_object_mut() {
                    object.insert("id".to_owned(), proxy_id);
                }
                // It belongs to the unit's newest request in flight, if any (an
                // elicitation during a call); over HTTP it then travels on that
                // call's stream.
                match self.units[unit].pending.iter().next_back() {
                    Some((during, forward)) => UnitMessage::Related {
                        stream: forward.reply.events.clone(),
                        message,
                        when_full: WhenFull::General,
                        during: Some(*during),
                    },
                    None => UnitMessage::General(message),
                }
            }
            Kind::Notification { method } => match method.as_str() {
                "notifications/progress" => self.progress(unit, message),
                "notifications/cancelled" => {
                    let Some(request_id) = params(&message).and_then(|p| p.get("requestId")) else {
                        return UnitMessage::Done;
                    };
                    let found = self
                        .server_requests
                        .iter()
                        .find(|(_, (owner, id))| *owner == unit && id == request_id)
                        .map(|(key, _)| key.clone());
                    let Some(key) = found else {
                        return UnitMessage::Done;
                    };
                    self.server_requests.remove(&key);
                    let proxy_id: Value = serde_json::from_str(&key).unwrap_or(Value::String(key));
                    if let Some(params) = params_mut(&mut message) {
                        params.insert("requestId".to_owned(), proxy_id);
                    }
                    UnitMessage::General(message)
                }
                _ => UnitMessage::General(message),
            },
        }
    }

    fn progress(&mut self, unit: usize, mut message: Value) -> UnitMessage<T> {
        let Some(unit_id) = params(&message)
            .and_then(|params| params.get("progressToken"))
            .and_then(Value::as_u64)
        else {
            return UnitMessage::Done;
        };
        let Some(forward) = self.units[unit].pending.get(&unit_id) else {
            return UnitMessage::Done;
        };
        let Some(token) = forward.progress_token.clone() else {
            return UnitMessage::Done;
        };
        if let Some(params) = params_mut(&mut message) {
            params.insert("progressToken".to_owned(), token);
        }
        UnitMessage::Related {
            stream: forward.reply.events.clone(),
            message,
            when_full: WhenFull::Drop,
            during: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use box_jsonrpc::reply_channel;
    use pretty_assertions::assert_eq;

    #[test]
    fn units_join_and_leave_during_a_session() {
        let mut router: Router<()> = Router::new(1, 1);
        let added = router.add_unit(1);
        assert_eq!(added, 1);
        let (reply, _stream) = reply_channel();
        let (unit_id, _) = router.forward(
            added,
            json!({"jsonrpc":"2.0","id":"a","method":"tools/call","params":{}}),
            reply,
            (),
        );
        assert!(router.is_in_flight(&json!("a")));
        let taken = router.remove_unit(added);
        assert_eq!(taken.len(), 1);
        assert_eq!(taken[0].client_id, json!("a"));
        assert!(!router.is_in_flight(&json!("a")));
        // A late answer from the removed unit reaches no one.
        let late = json!({"jsonrpc":"2.0","id":unit_id,"result":{}});
        assert!(!matches!(
            router.from_unit(added, late),
            UnitMessage::Answer { .. }
        ));
        // A unit added later gets a fresh index.
        assert_eq!(router.add_unit(1), 2);
    }

    #[test]
    fn ids_and_tokens_round_trip_with_their_types() {
        let mut router: Router<()> = Router::new(2, 1);
        let (reply_a, mut stream_a) = reply_channel();
        let (reply_b, mut stream_b) = reply_channel();
        let (id_a, sent_a) = router.forward(
            0,
            json!({"jsonrpc":"2.0","id":"7","method":"tools/call","params":{"_meta":{"progressToken":"t"},"x":1}}),
            reply_a,
            (),
        );
        let (id_b, _sent_b) = router.forward(
            0,
            json!({"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"_meta":{"progressToken":7}}}),
            reply_b,
            (),
        );
        assert_ne!(id_a, id_b);
        assert_eq!(sent_a["id"], json!(id_a));
        assert_eq!(sent_a["params"]["_meta"]["progressToken"], json!(id_a));
        assert_eq!(sent_a["params"]["x"], json!(1));
        assert!(router.is_in_flight(&json!("7")));
        assert!(router.is_in_flight(&json!(7)));

        let progress = json!({"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":id_b,"progress":1}});
        let UnitMessage::Related {
            stream,
            message,
            when_full,
            during: None,
        } = router.from_unit(0, progress)
        else {
            panic!("progress not related to its request");
        };
        assert_eq!(message["params"]["progressToken"], json!(7));
        assert_eq!(when_full, WhenFull::Drop);
        // The router hands the message back; nothing is on a stream yet.
        assert!(stream_b.events.try_recv().is_err());
        stream.try_send(message).unwrap();
        assert_eq!(
            stream_b.events.try_recv().unwrap()["params"]["progressToken"],
            json!(7)
        );
        assert!(stream_a.events.try_recv().is_err());

        let answer = json!({"jsonrpc":"2.0","id":id_a,"result":{"extra":true}});
        let UnitMessage::Answer { forward, response } = router.from_unit(0, answer) else {
            panic!("not an answer");
        };
        assert_eq!(
            response,
            json!({"jsonrpc":"2.0","id":"7","result":{"extra":true}})
        );
        forward.reply.answer(response);
        assert_eq!(stream_a.response.try_recv().unwrap()["id"], json!("7"));
        assert!(!router.is_in_flight(&json!("7")));
        // A late duplicate is dropped, never answered twice.
        let again = json!({"jsonrpc":"2.0","id":id_a,"result":{}});
        assert!(matches!(router.from_unit(0, again), UnitMessage::Done));
    }

    #[test]
    fn a_request_is_forwarded_as_it_came_but_for_its_id() {
        let mut router: Router<()> = Router::new(1, 1);
        for original in [
            json!({"jsonrpc":"2.0","id":1,"method":"tools/list"}),
            json!({"jsonrpc":"2.0","id":2,"method":"x","params":{"_meta":{"k":"v"},"a":null}}),
        ] {
            let (reply, _stream) = reply_channel();
            let (unit_id, mut sent) = router.forward(0, original.clone(), reply, ());
            assert_eq!(sent["id"], json!(unit_id));
            sent["id"] = original["id"].clone();
            assert_eq!(sent, original);
        }
    }

    #[test]
    fn cancellation_is_translated_and_unknown_ids_are_dropped() {
        let mut router: Router<()> = Router::new(1, 1);
        let (reply, _stream) = reply_channel();
        let (unit_id, _) = router.forward(
            0,
            json!({"jsonrpc":"2.0","id":42,"method":"tools/call"}),
            reply,
            (),
        );
        let cancel = json!({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":42,"reason":"r"}});
        let (unit, sent, _forward) = router.client_cancel(cancel.clone()).unwrap();
        assert_eq!(unit, 0);
        assert_eq!(sent["params"], json!({"requestId": unit_id, "reason": "r"}));
        assert!(router.client_cancel(cancel).is_none());
    }

    #[test]
    fn server_requests_get_proxy_ids_and_answers_go_back() {
        let mut router: Router<()> = Router::new(2, 1);
        let (reply, mut stream) = reply_channel();
        router.forward(
            1,
            json!({"jsonrpc":"2.0","id":1,"method":"tools/call"}),
            reply,
            (),
        );
        let ask = json!({"jsonrpc":"2.0","id":0,"method":"elicitation/create","params":{}});
        let UnitMessage::Related {
            stream: related,
            message: sent,
            when_full,
            during: Some(_),
        } = router.from_unit(1, ask)
        else {
            panic!("a request during a call not related to it");
        };
        assert_eq!(when_full, WhenFull::General);
        assert!(stream.events.try_recv().is_err(), "the router sent it");
        related.try_send(sent).unwrap();
        let sent = stream.events.try_recv().unwrap();
        let proxy_id = sent["id"].clone();
        assert_ne!(proxy_id, json!(0));
        let (unit, back) = router
            .client_response(json!({"jsonrpc":"2.0","id":proxy_id,"result":{"action":"accept"}}))
            .unwrap();
        assert_eq!(unit, 1);
        assert_eq!(back["id"], json!(0));
        // Between calls, a server request is general.
        let ping = json!({"jsonrpc":"2.0","id":"p","method":"ping"});
        assert!(matches!(router.from_unit(0, ping), UnitMessage::General(_)));
    }

    #[test]
    fn a_unit_cannot_flood_the_client_with_requests() {
        let mut router: Router<()> = Router::new(1, 1);
        for n in 0..MAX_SERVER_REQUESTS {
            let ask = json!({"jsonrpc":"2.0","id":n,"method":"ping"});
            assert!(matches!(router.from_unit(0, ask), UnitMessage::General(_)));
        }
        let ask = json!({"jsonrpc":"2.0","id":"over","method":"ping"});
        let UnitMessage::Refuse(answer) = router.from_unit(0, ask) else {
            panic!("not refused");
        };
        assert_eq!(answer["id"], json!("over"));
        assert!(
            answer["error"]["message"]
                .as_str()
                .unwrap()
                .contains("waiting")
        );
    }
}
