//! The README's examples, run as a reader would run them.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::{box_bin, repo_root};

/// The first ```sh block after `heading` in README.md.
fn sh_block_after(heading: &str) -> String {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let section = &readme[readme
        .find(heading)
        .unwrap_or_else(|| panic!("README.md has no {heading:?}"))..];
    let start = section.find("```sh\n").expect("a ```sh block") + "```sh\n".len();
    let end = section[start..].find("```").expect("the block's end");
    section[start..start + end].to_owned()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Run the first ```sh block after `heading` as a reader would (`box` on
/// PATH, a fresh directory, port 8080 replaced by a free one); its stdout.
fn run_curl_block(heading: &str) -> String {
    // No backend is named: docker when an engine answers, else local; the block works on both.
    let port = free_port().to_string();
    let script = sh_block_after(heading).replace("8080", &port);
    // `box` on PATH is the binary under test, as `scripts/install.sh` would put it.
    let bin = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(box_bin(), bin.path().join("box")).unwrap();
    let workspace = tempfile::tempdir().unwrap();
    let path = format!(
        "{}:{}",
        bin.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut child = Command::new("timeout")
        .args([
            "-s", "KILL", "120", "bash", "-euo", "pipefail", "-c", &script,
        ])
        .current_dir(workspace.path())
        .env("PATH", path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let output = {
        let deadline = std::time::Instant::now() + Duration::from_secs(130);
        while child.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        child.wait_with_output().unwrap()
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the README's curl session after {heading:?} failed: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    stdout.into_owned()
}

#[test]
fn the_curl_session_over_http_runs_as_written() {
    let stdout = run_curl_block("## A session over HTTP, with curl");
    assert!(
        stdout.contains(r#""id":2,"result":{"content":[{"type":"text","text":"hello from "#)
            && stdout.contains(r#"[exit 0]"}],"isError":false}"#),
        "the call's answer is not what the README shows:\n{stdout}"
    );
}

#[test]
fn the_stateless_curl_session_runs_as_written() {
    let stdout = run_curl_block("## MCP 2026-07-28: sessions as handles");
    assert!(
        stdout.contains(r#""id":2,"result":{"content":[{"type":"text","text":"hello from "#)
            && stdout.contains(r#"[exit 0]"}],"isError":false,"resultType":"complete"}"#),
        "the call's answer is not what the README shows:\n{stdout}"
    );
    assert!(
        stdout.contains(r#""id":3,"result":{"resultType":"complete"}"#),
        "the close's answer:\n{stdout}"
    );
}
