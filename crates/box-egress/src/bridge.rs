//! The in-unit half: a loopback TCP port whose connections reach the unit's proxy
//! (handed to the proxy, or forwarded to its socket), and the environment that
//! points tools at it.
//!
//! The bridge holds no policy. Any process in the unit can reach the bind-mounted
//! socket directly, so everything is judged on the host side; the bridge exists only
//! because tools speak to proxies over TCP.

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio::task::JoinSet;
use tokio::time::{Instant, timeout};

use crate::handoff::{self, Offer};
use crate::proxy::is_momentary;
use crate::splice::relay;

/// The loopback port a unit's bridge listens on unless told otherwise (the
/// conventional HTTP proxy port).
pub const BRIDGE_PORT: u16 = 3128;

/// How long the bridge relays before it offers its listener again, after the
/// proxy socket did not answer or a handoff ended early.
const OFFER_AGAIN: Duration = Duration::from_secs(1);

/// The longest a proxy may take to answer an offer (a frozen host must not
/// leave the unit's connections unaccepted).
const OFFER_ANSWER: Duration = Duration::from_secs(5);

/// Serve the unit's proxy port on `listener` until the returned future is
/// dropped (which ends every connection it relays). First it hands the listener
/// to the proxy at `proxy_socket` ([`crate::handoff`]), so the proxy accepts the
/// unit's connections itself and no byte crosses this process; while the proxy
/// does not hold it (the host restarting, a sandbox whose socket cannot carry
/// descriptors), it forwards every connection to the socket. When the socket does
/// not answer, the client gets a 502 naming it. Returns only when accepting fails
/// for a reason other than a momentary shortage.
pub async fn bridge(listener: TcpListener, proxy_socket: PathBuf) -> io::Result<()> {
    let mut connections = JoinSet::new();
    let mut offering = true;
    loop {
        // Whether to relay for a while before the next offer (never ends
        // once the proxy declined).
        let relay = !offering
            || match timeout(OFFER_ANSWER, handoff::offer(&listener, &proxy_socket)).await {
                Ok(Ok(control)) => {
                    tracing::debug!(socket = %proxy_socket.display(), "egress bridge handed its listener to the proxy");
                    let held = Instant::now();
                    hold(control, &mut connections).await;
                    tracing::debug!(socket = %proxy_socket.display(), "egress proxy gave the listener back; relaying");
                    // A handoff that ends at once must not turn into a loop of offers.
                    held.elapsed() < OFFER_AGAIN
                }
                Ok(Err(Offer::Declined(reason))) => {
                    tracing::info!(socket = %proxy_socket.display(), %reason, "egress proxy declined the bridge's listener; relaying every connection");
                    offering = false;
                    true
                }
                Ok(Err(Offer::Unreachable(error))) => {
                    tracing::debug!(socket = %proxy_socket.display(), %error, "egress proxy did not take the listener; relaying");
                    true
                }
                Err(_) => {
                    tracing::warn!(socket = %proxy_socket.display(), "egress proxy did not answer the listener's handoff within {OFFER_ANSWER:?}; relaying");
                    true
                }
            };
        if relay {
            let until = offering.then(|| Instant::now() + OFFER_AGAIN);
            accept(&listener, &proxy_socket, &mut connections, until).await?;
        }
    }
}

/// Wait while the proxy holds the listener, keeping the relayed connections
/// that were open before it took it going.
async fn hold(mut control: UnixStream, connections: &mut JoinSet<()>) {
    let mut byte = [0; 1];
    loop {
        tokio::select! {
            // The proxy sends nothing more: any byte, or the end, ends the handoff.
            _ = control.read(&mut byte) => return,
            Some(_) = connections.join_next() => {}
        }
    }
}

/// Accept and forward every connection, until `until` when given.
async fn accept(
    listener: &TcpListener,
    proxy_socket: &Path,
    connections: &mut JoinSet<()>,
    until: Option<Instant>,
) -> io::Result<()> {
    let deadline = async {
        match until {
            Some(until) => tokio::time::sleep_until(until).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    connections.spawn(forward(stream, proxy_socket.to_owned()));
                }
                Err(error) if is_momentary(&error) => {
                    tracing::warn!(%error, "egress bridge cannot accept; retrying");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(error) => return Err(error),
            },
            Some(_) = connections.join_next() => {}
            () = &mut deadline => return Ok(()),
        }
    }
}

async fn forward(client: TcpStream, proxy_socket: PathBuf) {
    let _ = client.set_nodelay(true);
    let proxy = match UnixStream::connect(&proxy_socket).await {
        Ok(proxy) => proxy,
        Err(error) => {
            let mut client = client;
            return unreachable(&mut client, &proxy_socket, &error).await;
        }
    };
    crate::splice::widen_send_buffer(&proxy);
    let (mut client_reader, mut client_writer) = client.into_split();
    let (mut proxy_reader, mut proxy_writer) = proxy.into_split();
    // Each direction ends at its end of stream and passes the half-close on; either
    // failing ends the connection. There is nothing to report: the proxy reports.
    let (mut up, mut down) = (0, 0);
    let _ = tokio::try_join!(
        relay(&mut client_reader, &mut proxy_writer, None, &mut up),
        relay(&mut proxy_reader, &mut client_writer, None, &mut down),
    );
}

async fn unreachable(client: &mut TcpStream, proxy_socket: &Path, error: &io::Error) {
    tracing::warn!(socket = %proxy_socket.display(), %error, "egress proxy socket does not answer");
    let body = format!(
        "box egress: the proxy socket {} does not answer: {error}\n",
        proxy_socket.display()
    );
    let response = format!(
        "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = client.write_all(response.as_bytes()).await;
    let _ = client.shutdown().await;
}

/// The variables that point a unit's tools at the bridge at `proxy` (a loopback
/// address): the `*_PROXY` family in both cases (pip, npm, cargo, Go and git
/// read them and need nothing of their own: `tests/it/registries.rs`), `NO_PROXY`
/// for loopback, and the
/// extras some tools read instead (gRPC, Docker, rsync, gcloud) or need to honour
/// the others at all (Node's built-in `fetch` ignores proxy variables without
/// `NODE_USE_ENV_PROXY=1`, Node ≥ 24). The JVM reads none of these; a unit that runs
/// Java tools needs `-Dhttps.proxyHost`/`-Dhttps.proxyPort` of its own, which box
/// does not set (`JAVA_TOOL_OPTIONS` would override the tool's own options and print
/// a notice on every start).
pub fn proxy_environment(proxy: SocketAddr) -> BTreeMap<&'static str, String> {
    let url = format!("http://{proxy}");
    let host = match proxy {
        SocketAddr::V4(v4) => v4.ip().to_string(),
        SocketAddr::V6(v6) => format!("[{}]", v6.ip()),
    };
    let no_proxy = "localhost,127.0.0.1,::1".to_owned();
    BTreeMap::from([
        ("HTTP_PROXY", url.clone()),
        ("HTTPS_PROXY", url.clone()),
        ("ALL_PROXY", url.clone()),
        ("http_proxy", url.clone()),
        ("https_proxy", url.clone()),
        ("all_proxy", url.clone()),
        ("NO_PROXY", no_proxy.clone()),
        ("no_proxy", no_proxy),
        ("GRPC_PROXY", url.clone()),
        ("grpc_proxy", url.clone()),
        ("DOCKER_HTTP_PROXY", url.clone()),
        ("DOCKER_HTTPS_PROXY", url),
        ("RSYNC_PROXY", proxy.to_string()),
        ("CLOUDSDK_PROXY_TYPE", "http".to_owned()),
        ("CLOUDSDK_PROXY_ADDRESS", host),
        ("CLOUDSDK_PROXY_PORT", proxy.port().to_string()),
        ("NODE_USE_ENV_PROXY", "1".to_owned()),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn the_environment_names_the_bridge_everywhere() {
        let environment = proxy_environment("127.0.0.1:3128".parse().unwrap());
        assert_eq!(environment["HTTPS_PROXY"], "http://127.0.0.1:3128");
        assert_eq!(environment["all_proxy"], "http://127.0.0.1:3128");
        assert_eq!(environment["NO_PROXY"], "localhost,127.0.0.1,::1");
        assert_eq!(environment["RSYNC_PROXY"], "127.0.0.1:3128");
        assert_eq!(environment["CLOUDSDK_PROXY_PORT"], "3128");
        assert_eq!(environment["NODE_USE_ENV_PROXY"], "1");
        let v6 = proxy_environment("[::1]:3128".parse().unwrap());
        assert_eq!(v6["HTTP_PROXY"], "http://[::1]:3128");
        assert_eq!(v6["CLOUDSDK_PROXY_ADDRESS"], "[::1]");
    }
}
