//! A client of a running `box serve --listen` host over streamable HTTP:
//! what `box run --host` and `box doctor --host` speak. One handshake-era
//! session (`initialize`, then requests carrying its `Mcp-Session-Id`,
//! ended by DELETE, which the host answers once its units are gone), and the
//! host's probes (`/readyz`, `/metrics`).
//!
//! Plain `http://` only (no TLS in box): a host off this machine is reached
//! through a tunnel that terminates TLS. Connections are kept and reused, one
//! request at a time each, so the polling reads of a command's output do not
//! pay a connect per call.

use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::{Method, Request, StatusCode, header};
use hyper_util::rt::TokioIo;
use serde_json::Value;

/// How long connecting to the host may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The most bytes of one answer read (a process read's 64 KiB is far below).
const MAX_ANSWER_BYTES: usize = 64 << 20;
/// The session header (streamable HTTP).
const SESSION_HEADER: &str = "mcp-session-id";

/// Where a host listens: `http://HOST[:PORT][/PATH]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostUrl {
    /// The name or address to connect to (an IPv6 address without brackets).
    pub host: String,
    /// The port (80 when the URL names none).
    pub port: u16,
    /// `host:port` as the `Host` header writes it.
    pub authority: String,
    /// The MCP endpoint's path (`/mcp` when the URL has none).
    pub path: String,
}

impl HostUrl {
    /// Parse `url`; a bare `HOST:PORT` or `PORT` means `http://` on it (a bare
    /// port is loopback, as `box serve --listen PORT` binds it).
    pub fn parse(url: &str) -> Result<Self, String> {
        let rest = if let Some(rest) = url.strip_prefix("http://") {
            rest
        } else if url.starts_with("https://") {
            return Err(format!(
                "{url}: https is not spoken here; box serve listens on plain HTTP (reach a remote host through a tunnel that ends TLS, e.g. `ssh -L`)"
            ));
        } else if url.contains("://") {
            return Err(format!("{url}: not an http:// URL"));
        } else if url.parse::<u16>().is_ok() {
            return Self::parse(&format!("http://127.0.0.1:{url}"));
        } else {
            url
        };
        let (authority, path) = match rest.find('/') {
            Some(at) => (&rest[..at], &rest[at..]),
            None => (rest, ""),
        };
        if authority.is_empty() {
            return Err(format!("{url}: no host"));
        }
        if authority.contains('@') {
            return Err(format!(
                "{url}: credentials in the URL are not taken; give the bearer token with --token-file"
            ));
        }
        let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
            let (host, after) = bracketed
                .split_once(']')
                .ok_or_else(|| format!("{url}: an IPv6 address without its closing `]`"))?;
            (host, after.strip_prefix(':'))
        } else {
            match authority.rsplit_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (authority, None),
            }
        };
        let port = match port {
            Some(port) => port
                .parse::<u16>()
                .map_err(|_| format!("{url}: `{port}` is not a port"))?,
            None => 80,
        };
        let path = match path {
            "" | "/" => "/mcp".to_owned(),
            path => path.to_owned(),
        };
        Ok(Self {
            host: host.to_owned(),
            port,
            authority: authority.to_owned(),
            path,
        })
    }

    /// The URL of `path` on this host.
    pub fn at(&self, path: &str) -> String {
        format!("http://{}{path}", self.authority)
    }
}

/// What went wrong between this client and the host.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The host could not be reached, or the connection broke.
    #[error("{url}: {why}")]
    Unreachable {
        /// Where.
        url: String,
        /// Why.
        why: String,
    },
    /// The host answered with an HTTP error.
    #[error("{url}: HTTP {status}: {message}")]
    Refused {
        /// Where.
        url: String,
        /// The status.
        status: u16,
        /// The JSON-RPC error's message, or the body.
        message: String,
    },
    /// The host's answer is not what the protocol says.
    #[error("{url}: {why}")]
    Malformed {
        /// Where.
        url: String,
        /// What was wrong with it.
        why: String,
    },
}

/// One answer: its status, its content type, and its body.
struct Answer {
    status: StatusCode,
    session: Option<String>,
    content_type: String,
    body: Bytes,
}

/// A client of one host, holding at most one session.
pub struct HostClient {
    url: HostUrl,
    token: Option<String>,
    session: Mutex<Option<String>>,
    version: Mutex<Option<String>>,
    idle: Mutex<Vec<SendRequest<Full<Bytes>>>>,
}

impl HostClient {
    /// A client of the host at `url`, sending `token` as its bearer token.
    pub fn new(url: HostUrl, token: Option<String>) -> Self {
        Self {
            url,
            token,
            session: Mutex::new(None),
            version: Mutex::new(None),
            idle: Mutex::new(Vec::new()),
        }
    }

    /// Where the host's MCP endpoint is.
    pub fn endpoint(&self) -> String {
        self.url.at(&self.url.path)
    }

    /// The session this client holds, if any.
    pub fn session(&self) -> Option<String> {
        lock(&self.session).clone()
    }

    /// Send one request and return its answer (a JSON-RPC response: a
    /// `result` or an `error`); the events before it (progress, logs) are
    /// dropped. The answer to `initialize` makes its session this client's.
    pub async fn request(&self, message: Value) -> Result<Value, ClientError> {
        let id = message.get("id").cloned().unwrap_or(Value::Null);
        let initialize = message.get("method").and_then(Value::as_str) == Some("initialize");
        let answer = self
            .send(Method::POST, &self.url.path, Some(&message))
            .await?;
        let url = self.endpoint();
        if !answer.status.is_success() {
            return Err(refused(&url, &answer));
        }
        let messages = if answer.content_type.starts_with("text/event-stream") {
            events(&answer.body)
        } else {
            vec![
                serde_json::from_slice(&answer.body).map_err(|error| ClientError::Malformed {
                    url: url.clone(),
                    why: format!("the answer is not JSON: {error}"),
                })?,
            ]
        };
        let response = messages
            .into_iter()
            .find(|message| message.get("id") == Some(&id) && message.get("method").is_none())
            .ok_or_else(|| ClientError::Malformed {
                url: url.clone(),
                why: "the answer ended without the request's response (cancelled?)".to_owned(),
            })?;
        if initialize && response.get("result").is_some() {
            *lock(&self.session) = answer.session;
            *lock(&self.version) = response["result"]["protocolVersion"]
                .as_str()
                .map(str::to_owned);
        }
        Ok(response)
    }

    /// Send one notification (answered 202, with nothing).
    pub async fn notify(&self, message: Value) -> Result<(), ClientError> {
        let answer = self
            .send(Method::POST, &self.url.path, Some(&message))
            .await?;
        if answer.status.is_success() {
            Ok(())
        } else {
            Err(refused(&self.endpoint(), &answer))
        }
    }

    /// End this client's session. Waiting (`wait`), the host answers once
    /// its units are removed (an error says what it could not confirm);
    /// else it answers at once (`Prefer: respond-async`) and removes them.
    pub async fn end(&self, wait: bool) -> Result<(), ClientError> {
        if self.session().is_none() {
            return Ok(());
        }
        let prefer = (!wait).then_some("respond-async");
        let answer = self
            .send_with(Method::DELETE, &self.url.path, None, prefer)
            .await?;
        match answer.status {
            status if status.is_success() || status == StatusCode::NOT_FOUND => {
                *lock(&self.session) = None;
                Ok(())
            }
            _ => Err(refused(&self.endpoint(), &answer)),
        }
    }

    /// GET `path` of the host (`/readyz`, `/metrics`): its status and text.
    pub async fn get(&self, path: &str) -> Result<(u16, String), ClientError> {
        let answer = self.send(Method::GET, path, None).await?;
        Ok((
            answer.status.as_u16(),
            String::from_utf8_lossy(&answer.body).into_owned(),
        ))
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Answer, ClientError> {
        self.send_with(method, path, body, None).await
    }

    async fn send_with(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        prefer: Option<&str>,
    ) -> Result<Answer, ClientError> {
        let url = self.url.at(path);
        let unreachable = |why: String| ClientError::Unreachable {
            url: url.clone(),
            why,
        };
        let mut request = Request::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, &self.url.authority)
            .header(header::ACCEPT, "application/json, text/event-stream");
        if body.is_some() {
            request = request.header(header::CONTENT_TYPE, "application/json");
        }
        if let Some(prefer) = prefer {
            request = request.header("prefer", prefer);
        }
        if let Some(token) = &self.token {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        if let Some(session) = self.session() {
            request = request.header(SESSION_HEADER, session);
        }
        if let Some(version) = lock(&self.version).clone() {
            request = request.header("mcp-protocol-version", version);
        }
        let body = match body {
            Some(body) => Bytes::from(body.to_string()),
            None => Bytes::new(),
        };
        let request = request
            .body(Full::new(body))
            .map_err(|error| unreachable(format!("building the request: {error}")))?;
        let mut sender = self.connection().await.map_err(unreachable)?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|error| unreachable(format!("the connection broke: {error}")))?;
        let status = response.status();
        let header_text = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned)
        };
        let session = header_text(SESSION_HEADER);
        let content_type = header_text(header::CONTENT_TYPE.as_str()).unwrap_or_default();
        let body = http_body_util::Limited::new(response.into_body(), MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|error| unreachable(format!("reading the answer: {error}")))?
            .to_bytes();
        // Read whole: the connection may carry the next request.
        if sender.is_ready() {
            lock(&self.idle).push(sender);
        }
        Ok(Answer {
            status,
            session,
            content_type,
            body,
        })
    }

    /// A kept connection that is ready, or a new one.
    async fn connection(&self) -> Result<SendRequest<Full<Bytes>>, String> {
        loop {
            let Some(mut kept) = lock(&self.idle).pop() else {
                break;
            };
            if kept.ready().await.is_ok() {
                return Ok(kept);
            }
        }
        let stream = tokio::time::timeout(
            CONNECT_TIMEOUT,
            tokio::net::TcpStream::connect((self.url.host.as_str(), self.url.port)),
        )
        .await
        .map_err(|_| {
            format!(
                "no connection within {}",
                humantime::format_duration(CONNECT_TIMEOUT)
            )
        })?
        .map_err(|error| format!("connecting: {error} (is `box serve --listen` running there?)"))?;
        let _ = stream.set_nodelay(true);
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|error| format!("the HTTP handshake: {error}"))?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "a connection to the host ended");
            }
        });
        Ok(sender)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The error an HTTP refusal is: its JSON-RPC message when it has one.
fn refused(url: &str, answer: &Answer) -> ClientError {
    let text = String::from_utf8_lossy(&answer.body);
    let message = serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|body| body["error"]["message"].as_str().map(str::to_owned))
        .unwrap_or_else(|| text.trim().to_owned());
    let message = match answer.status {
        StatusCode::UNAUTHORIZED if message.is_empty() => {
            "the host wants a bearer token (--token-file)".to_owned()
        }
        StatusCode::NOT_FOUND => format!(
            "{message} (the host no longer has this session: it ended, idled out, or the host restarted)"
        ),
        _ => message,
    };
    ClientError::Refused {
        url: url.to_owned(),
        status: answer.status.as_u16(),
        message,
    }
}

/// The JSON messages of an SSE body (each event's `data` lines joined).
fn events(body: &[u8]) -> Vec<Value> {
    let text = String::from_utf8_lossy(body);
    let mut messages = Vec::new();
    let mut data = String::new();
    for line in text.split('\n').map(|line| line.trim_end_matches('\r')) {
        if line.is_empty() {
            if let Ok(message) = serde_json::from_str(&data) {
                messages.push(message);
            }
            data.clear();
        } else if let Some(value) = line.strip_prefix("data:") {
            if !data.is_empty() {
                data.push('\n');
            }
            data.push_str(value.strip_prefix(' ').unwrap_or(value));
        }
    }
    if let Ok(message) = serde_json::from_str(&data) {
        messages.push(message);
    }
    messages
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn host_urls_are_read_as_box_serve_listens() {
        let url = HostUrl::parse("http://127.0.0.1:8080").unwrap();
        assert_eq!(
            (url.host.as_str(), url.port, url.path.as_str()),
            ("127.0.0.1", 8080, "/mcp")
        );
        assert_eq!(HostUrl::parse("8080").unwrap().authority, "127.0.0.1:8080");
        let url = HostUrl::parse("http://[::1]:9/mcp/p/ci").unwrap();
        assert_eq!(
            (url.host.as_str(), url.port, url.path.as_str()),
            ("::1", 9, "/mcp/p/ci")
        );
        assert_eq!(HostUrl::parse("box.example.com").unwrap().port, 80);
        assert!(
            HostUrl::parse("https://box.example.com")
                .unwrap_err()
                .contains("tunnel")
        );
        assert!(
            HostUrl::parse("http://user:pw@box.example.com")
                .unwrap_err()
                .contains("--token-file")
        );
        assert!(
            HostUrl::parse("http://h:port")
                .unwrap_err()
                .contains("not a port")
        );
    }

    #[test]
    fn an_sse_answer_gives_each_events_message() {
        let body = b"event: message\r\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\r\n\r\ndata: {\"jsonrpc\":\"2.0\",\ndata: \"id\":1,\"result\":{}}\n\n";
        assert_eq!(
            events(body),
            vec![
                json!({"jsonrpc": "2.0", "method": "notifications/progress"}),
                json!({"jsonrpc": "2.0", "id": 1, "result": {}}),
            ]
        );
    }
}
