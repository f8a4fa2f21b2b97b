//! Answering a request: JSON, or SSE once something streams before the
//! answer (as the client's `Accept` allows).

use super::*;

/// Answer a request: JSON when nothing streams before the answer, else SSE
/// (as far as the client's `Accept` allows: a JSON-only client gets the
/// answer alone, an SSE-only client always a stream). A request the client
/// cancelled gets no JSON-RPC answer at all ([`unanswered`]).
pub(super) async fn answer(stream: ReplyStream, accepts: Accepts) -> Response {
    answer_of(stream, accepts, None).await
}

/// [`answer`], with the answer to a stateless request (`stateless`: its
/// method) in the revision's form, and the request cancelled in its
/// session when the client closes the stream before the answer.
pub(super) async fn answer_of(
    mut stream: ReplyStream,
    accepts: Accepts,
    stateless: Option<(&str, crate::CancelOnClose)>,
) -> Response {
    let (method, mut cancel) = match stateless {
        Some((method, cancel)) => (Some(method), Some(cancel)),
        None => (None, None),
    };
    let first = loop {
        let first = tokio::select! {
            biased;
            Some(event) = stream.events.recv() => Ok(event),
            response = &mut stream.response => Err(response),
        };
        match first {
            // A client that takes no streams cannot be sent what would stream.
            Ok(_) if !accepts.sse => continue,
            first => break first,
        }
    };
    let first = match first {
        Err(Ok(mut response)) => {
            if let Some(cancel) = cancel.as_mut() {
                cancel.armed = false;
            }
            if let Some(method) = method {
                box_jsonrpc::era::complete_result(method, &mut response);
            }
            if accepts.json {
                return json_response(StatusCode::OK, response);
            }
            response
        }
        // Dropped unanswered: the client cancelled it (MCP: no response is sent).
        Err(Err(_)) => {
            if let Some(cancel) = cancel.as_mut() {
                cancel.armed = false;
            }
            return unanswered(accepts);
        }
        Ok(event) => event,
    };
    let (out_tx, out_rx) = mpsc::channel(box_jsonrpc::REPLY_EVENTS);
    let _ = out_tx.send(first).await;
    let method = method.map(str::to_owned);
    tokio::spawn(async move {
        let answered = crate::forward_reply_of(stream, out_tx, method.as_deref()).await;
        if let Some(mut cancel) = cancel {
            cancel.armed = !answered;
        }
    });
    sse(out_rx)
}

/// The end of a POST whose request the client cancelled: MCP says the
/// receiver sends no response, so no JSON-RPC body. An SSE stream that ends
/// without a message when the client takes streams (the form a request's
/// answer may always have), else 202 with an empty body.
pub(super) fn unanswered(accepts: Accepts) -> Response {
    if accepts.sse {
        let (_, nothing) = mpsc::channel(1);
        sse(nothing)
    } else {
        StatusCode::ACCEPTED.into_response()
    }
}

/// Which of the two answer forms a request's `Accept` allows (no header allows
/// both; `q=0` refuses a type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Accepts {
    pub(super) json: bool,
    pub(super) sse: bool,
}

impl Accepts {
    pub(super) fn from_headers(headers: &HeaderMap) -> Self {
        let mut values = headers.get_all(header::ACCEPT).iter().peekable();
        if values.peek().is_none() {
            return Self {
                json: true,
                sse: true,
            };
        }
        let mut accepts = Self {
            json: false,
            sse: false,
        };
        let ranges = values
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(','));
        for range in ranges {
            let mut parts = range.split(';');
            let media = parts.next().unwrap_or("").trim().to_ascii_lowercase();
            let refused = parts.any(|parameter| {
                parameter.split_once('=').is_some_and(|(name, value)| {
                    name.trim().eq_ignore_ascii_case("q")
                        && value.trim().parse::<f32>().is_ok_and(|q| q <= 0.0)
                })
            });
            if refused {
                continue;
            }
            match media.as_str() {
                "*/*" => {
                    accepts.json = true;
                    accepts.sse = true;
                }
                "application/json" | "application/*" => accepts.json = true,
                "text/event-stream" | "text/*" => accepts.sse = true,
                _ => {}
            }
        }
        accepts
    }
}

/// An SSE response of `messages`, one `message` event each, ending when they do.
pub(super) fn sse(messages: mpsc::Receiver<Value>) -> Response {
    let events = futures::stream::unfold(messages, |mut messages| async move {
        let message = messages.recv().await?;
        let event = Event::default().event("message").data(message.to_string());
        Some((Ok::<_, Infallible>(event), messages))
    });
    sse_response(
        Sse::new(events)
            .keep_alive(KeepAlive::default())
            .into_response(),
    )
}

/// An SSE response that proxies must not buffer (events are meant to arrive as they happen).
pub(super) fn sse_response(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}

/// The GET stream's receiver, put back when the stream goes so the client may open another.
pub(super) struct GeneralStream {
    pub(super) receiver: Option<mpsc::Receiver<Value>>,
    pub(super) slot: GeneralSlot,
}

impl Drop for GeneralStream {
    fn drop(&mut self) {
        if let (Some(receiver), Ok(mut slot)) = (self.receiver.take(), self.slot.lock()) {
            *slot = Some(receiver);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_headers_allow_what_they_name() {
        let accepts = |value: Option<&str>| {
            let mut headers = HeaderMap::new();
            if let Some(value) = value {
                headers.insert(header::ACCEPT, HeaderValue::from_str(value).unwrap());
            }
            let accepts = Accepts::from_headers(&headers);
            (accepts.json, accepts.sse)
        };
        assert_eq!(accepts(None), (true, true));
        assert_eq!(
            accepts(Some("application/json, text/event-stream")),
            (true, true)
        );
        assert_eq!(accepts(Some("*/*")), (true, true));
        assert_eq!(accepts(Some("Application/JSON")), (true, false));
        assert_eq!(accepts(Some("text/*;q=0.5")), (false, true));
        assert_eq!(
            accepts(Some("application/json;q=0, text/html")),
            (false, false)
        );
        assert_eq!(accepts(Some("text/html")), (false, false));
    }
}
