//! The in-unit bridge, driven by real clients (`curl`, and `openssl s_server` as a
//! real TLS upstream).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use box_egress::bridge;
use pretty_assertions::assert_eq;
use tokio::net::TcpListener;

use crate::support::{ALLOWED, HttpUpstream, Setup, decision, tool};

async fn start_bridge(socket: &Path) -> (u16, tokio::task::JoinHandle<std::io::Result<()>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(bridge(listener, socket.to_owned()));
    (port, task)
}

/// Run curl through the proxy at `bridge_port`; its stdout (`-w` appends the status).
pub(crate) async fn curl(bridge_port: u16, args: &[&str]) -> String {
    let mut command = Command::new("curl");
    command
        .args(["-sS", "--max-time", "10", "-w", " %{http_code}", "-x"])
        .arg(format!("http://127.0.0.1:{bridge_port}"))
        .args(args)
        .env_clear();
    let output = tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap();
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test]
async fn curl_through_the_bridge_reaches_allowed_names_only() {
    if tool("curl").is_none() {
        return;
    }
    let upstream = HttpUpstream::start().await;
    let port = upstream.port;
    let mut proxy = Setup::new(&[&format!("{ALLOWED}:{port}")]).start();
    let (bridge_port, bridge_task) = start_bridge(&proxy.socket).await;
    let ok = curl(bridge_port, &[&format!("http://{ALLOWED}:{port}/through")]).await;
    assert_eq!(ok, "hello /through 200");
    assert_eq!(
        decision(&proxy.event().await),
        format!("allowed {ALLOWED}:{port}")
    );
    let refused = curl(bridge_port, &[&format!("http://other.test:{port}/")]).await;
    assert!(
        refused.starts_with(&format!(
            "box egress refused other.test:{port}: not-allowed"
        )),
        "{refused}"
    );
    assert!(refused.ends_with(" 403"), "{refused}");
    assert_eq!(decision(&proxy.event().await), "refused not-allowed");
    bridge_task.abort();
}

#[tokio::test]
async fn the_bridge_answers_502_naming_a_socket_that_does_not_answer() {
    if tool("curl").is_none() {
        return;
    }
    let directory = tempfile::tempdir().unwrap();
    let socket = directory.path().join("missing.sock");
    let (bridge_port, bridge_task) = start_bridge(&socket).await;
    let answer = curl(bridge_port, &["http://example.com/"]).await;
    assert!(answer.contains("box egress: the proxy socket"), "{answer}");
    assert!(answer.contains("missing.sock does not answer"), "{answer}");
    assert!(answer.ends_with(" 502"), "{answer}");
    bridge_task.abort();
}

/// `openssl s_server` with a throwaway certificate for `allowed.test`, on a free port.
pub struct TlsServer {
    pub port: u16,
    child: std::process::Child,
    _directory: tempfile::TempDir,
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl TlsServer {
    pub async fn start() -> Self {
        let directory = tempfile::tempdir().unwrap();
        let (key, cert) = (
            directory.path().join("key.pem"),
            directory.path().join("cert.pem"),
        );
        let status = Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-days",
                "1",
                "-subj",
                "/CN=allowed.test",
                "-keyout",
            ])
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(status.success());
        let port = crate::support::closed_port().await;
        let child = Command::new("openssl")
            .args(["s_server", "-quiet", "-www", "-accept"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("-cert")
            .arg(&cert)
            .arg("-key")
            .arg(&key)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        for _ in 0..100 {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Self {
            port,
            child,
            _directory: directory,
        }
    }
}

#[tokio::test]
async fn curl_over_tls_through_the_bridge_passes_the_server_name_check() {
    if tool("curl").is_none() || tool("openssl").is_none() {
        return;
    }
    let server = TlsServer::start().await;
    let port = server.port;
    let mut proxy = Setup::new(&[&format!("{ALLOWED}:{port}")])
        .tls_port(port)
        .start();
    let (bridge_port, bridge_task) = start_bridge(&proxy.socket).await;
    let answer = curl(bridge_port, &["-k", &format!("https://{ALLOWED}:{port}/")]).await;
    assert!(answer.ends_with(" 200"), "{answer}");
    let event = proxy.event().await;
    assert_eq!(decision(&event), format!("allowed {ALLOWED}:{port}"));
    assert_eq!(event.sni.as_deref(), Some(ALLOWED));
    assert!(event.bytes_up > 200 && event.bytes_down > 200, "{event:?}");
    bridge_task.abort();
}
