//! The in-unit half: a loopback TCP port that forwards every connection to the unit's
//! proxy socket, and the environment that points tools at it.
//!
//! The bridge holds no policy. Any process in the unit can reach the bind-mounted
//! socket directly, so everything is judged on the host side; the bridge exists only
//! because tools speak to proxies over TCP.

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio::task::JoinSet;

use crate::proxy::is_momentary;
use crate::splice::relay;

/// The loopback port a unit's bridge listens on unless told otherwise (the
/// conventional HTTP proxy port).
pub const BRIDGE_PORT: u16 = 3128;

/// Forward every connection accepted on `listener` to the Unix socket at
/// `proxy_socket`, until the returned future is dropped (which ends every connection).
/// When the socket does not answer, the client gets a 502 naming it. Returns only when
/// accepting fails for a reason other than a momentary shortage.
pub async fn bridge(listener: TcpListener, proxy_socket: PathBuf) -> io::Result<()> {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    connections.spawn(forward(stream, proxy_socket.clone()));
                }
                Err(error) if is_momentary(&error) => {
                    tracing::warn!(%error, "egress bridge cannot accept; retrying");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(error) => return Err(error),
            },
            Some(_) = connections.join_next() => {}
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
/// address): the `*_PROXY` family in both cases, `NO_PROXY` for loopback, and the
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
