//! A `box serve --listen` host on a free port of 127.0.0.1, spoken to with
//! raw HTTP (`crate::serve::post`): one setup for every area (forks,
//! reattach). The port outlives one host, so a test can restart the host
//! where its clients expect it.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::serve::post;

/// How long a started host is given to listen.
const LISTENING_WITHIN: Duration = Duration::from_secs(15);

/// Where a test's `box serve --listen` hosts listen.
pub struct HttpHost {
    address: SocketAddr,
}

impl HttpHost {
    /// A port free now (bound and released), for the hosts to bind.
    pub fn on_a_free_port() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        Self {
            address: format!("127.0.0.1:{port}").parse().unwrap(),
        }
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// `command` (a `box serve`) listening here, with its stdin closed,
    /// started; not yet listening (see [`answering`](Self::answering)).
    pub fn spawn(&self, mut command: Command) -> Child {
        command
            .args(["--listen", &self.address.to_string()])
            .stdin(Stdio::null())
            .spawn()
            .unwrap()
    }

    /// `command` started and listening.
    pub async fn serve(&self, command: Command) -> Child {
        let child = self.spawn(command);
        self.answering(child).await
    }

    /// `child`, once the address answers; killed and a panic when it exits
    /// first or does not listen within 15 s.
    pub async fn answering(&self, mut child: Child) -> Child {
        let deadline = tokio::time::Instant::now() + LISTENING_WITHIN;
        while tokio::time::Instant::now() < deadline {
            if tokio::net::TcpStream::connect(self.address).await.is_ok() {
                return child;
            }
            if child.try_wait().unwrap().is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("box serve did not listen on {}", self.address);
    }

    /// A new session: `initialize` asking `capabilities`, with `headers`
    /// added (answered 200, or the test fails), then
    /// `notifications/initialized` when a session id came. The session id
    /// and the answer.
    pub async fn initialize(
        &self,
        capabilities: Value,
        headers: &[(&str, &str)],
    ) -> (Option<String>, Value) {
        let message = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": capabilities,
            "clientInfo": {"name": "box-tests", "version": "1"}}});
        let reply = post(self.address, None, headers, &message).await;
        assert_eq!(
            reply.status,
            200,
            "{}",
            String::from_utf8_lossy(&reply.body)
        );
        let session = reply.header("mcp-session-id").map(str::to_owned);
        let answer = reply.json();
        if let Some(session) = &session {
            let ready = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
            post(self.address, Some(session), &[], &ready).await;
        }
        (session, answer)
    }
}
