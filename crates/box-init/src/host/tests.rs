//! The host's end against an in-process stand-in for the init.

use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use super::*;
use crate::handshake::{self, Established};
use crate::line::LineEvent;
use crate::protocol::{EndReason, ExitReport, InitState};

const UNIT: &str = "session-1/workspace";

fn state() -> InitState {
    InitState {
        epoch: 0,
        lease_remaining_ms: 30_000,
        executor_pid: 7,
        executor_exit: None,
        pid1: true,
    }
}

/// Connects to `listener` as the init would, with `key`.
async fn fake_init(listener: &UnitListener, key: &UnitKey) -> Established {
    let stream = UnixStream::connect(listener.path()).await.unwrap();
    handshake::init_side(stream, key, UNIT, state)
        .await
        .unwrap()
}

/// Both ends of an authenticated channel.
async fn pair() -> (tempfile::TempDir, UnitChannel, Established) {
    let dir = tempfile::tempdir().unwrap();
    let listener = bind(dir.path()).unwrap();
    let key = UnitKey::generate();
    let (channel, init) = tokio::join!(
        listener.accept(&key, UNIT, Duration::from_secs(5)),
        fake_init(&listener, &key)
    );
    (dir, channel.unwrap(), init)
}

async fn next_line_from_host(init: &mut Established) -> String {
    assert_eq!(init.reader.next_line().await.unwrap(), LineEvent::Line);
    let line = String::from_utf8_lossy(init.reader.line()).into_owned();
    init.reader.consume();
    line
}

#[tokio::test]
async fn an_impostor_is_refused_and_the_real_init_still_gets_in() {
    let dir = tempfile::tempdir().unwrap();
    let listener = bind(dir.path()).unwrap();
    let key = UnitKey::generate();
    let path = listener.path().to_owned();
    let impostors = async {
        // One that connects and says nothing, holding its connection open.
        let silent = UnixStream::connect(&path).await.unwrap();
        // One with a key of its own.
        let wrong_key = UnixStream::connect(&path).await.unwrap();
        let refused = handshake::init_side(wrong_key, &UnitKey::generate(), UNIT, state).await;
        assert!(refused.is_err(), "the impostor must not get a welcome");
        // One speaking MCP instead of the handshake.
        let mut garbage = UnixStream::connect(&path).await.unwrap();
        garbage
            .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1}\n")
            .await
            .unwrap();
        // Then the real init.
        let real = fake_init(&listener, &key).await;
        (silent, garbage, real)
    };
    let started = tokio::time::Instant::now();
    let (channel, (_silent, _garbage, mut real)) = tokio::join!(
        listener.accept(&key, UNIT, Duration::from_secs(10)),
        impostors
    );
    let mut channel = channel.unwrap();
    assert!(
        started.elapsed() < HANDSHAKE_TIMEOUT,
        "the silent impostor held the real init back for {:?}",
        started.elapsed()
    );
    assert_eq!(channel.state, state());
    channel.writer.write_all(b"{\"id\":1}\n").await.unwrap();
    assert_eq!(next_line_from_host(&mut real).await, "{\"id\":1}\n");
}

#[tokio::test]
async fn accept_gives_up_after_its_timeout_naming_the_unit_and_path() {
    let dir = tempfile::tempdir().unwrap();
    let listener = bind(dir.path()).unwrap();
    let error = listener
        .accept(&UnitKey::generate(), UNIT, Duration::from_millis(50))
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert_eq!(
        error,
        format!(
            "unit {UNIT}: no authenticated init connected to {} within 50ms",
            listener.path().display()
        )
    );
}

#[tokio::test]
async fn control_lines_never_reach_the_reader_and_answer_renewals() {
    let (_dir, channel, mut init) = pair().await;
    let renewal = tokio::spawn(async move {
        let answer = channel
            .lease
            .renew_confirmed(Duration::from_secs(30), 4, Duration::from_secs(5))
            .await;
        (channel, answer)
    });
    assert_eq!(
        next_line_from_host(&mut init).await,
        "!{\"lease\":{\"ttlMs\":30000,\"epoch\":4}}\n"
    );
    init.writer
        .write_all(b"{\"a\":1}\n!{\"renewed\":{\"epoch\":4,\"remainingMs\":29999}}\n{\"b\":2}\n")
        .await
        .unwrap();
    let (channel, answer) = renewal.await.unwrap();
    assert_eq!(answer, Ok(Duration::from_millis(29999)));
    let mut lines = channel.reader.lines();
    assert_eq!(
        lines.next_line().await.unwrap().as_deref(),
        Some("{\"a\":1}")
    );
    assert_eq!(
        lines.next_line().await.unwrap().as_deref(),
        Some("{\"b\":2}")
    );
}

#[tokio::test]
async fn a_fenced_renewal_is_an_error_naming_both_epochs() {
    let (_dir, channel, mut init) = pair().await;
    let lease = std::sync::Arc::new(channel.lease);
    let renewing = lease.clone();
    let renewal = tokio::spawn(async move {
        let wait = Duration::from_secs(5);
        renewing
            .renew_confirmed(Duration::from_secs(30), 2, wait)
            .await
    });
    next_line_from_host(&mut init).await;
    init.writer
        .write_all(b"!{\"rejected\":{\"epoch\":2,\"current\":3}}\n")
        .await
        .unwrap();
    let answer = renewal.await.unwrap();
    let fenced = LeaseError::Fenced {
        epoch: 2,
        current: 3,
    };
    assert_eq!(answer, Err(fenced.clone()));
    assert_eq!(
        lease.latest(),
        Some(LeaseAnswer::Rejected {
            epoch: 2,
            current: 3
        })
    );
    assert_eq!(
        lease.renew(Duration::from_secs(30), 2).await,
        Err(fenced),
        "a fenced host's next renewal fails at once"
    );
    assert_eq!(
        answer.err().map(|e| e.to_string()).as_deref(),
        Some("lease renewal at epoch 2 refused: epoch 3 has taken over this unit")
    );
}

#[tokio::test]
async fn an_unanswered_renewal_times_out() {
    let (_dir, channel, _init) = pair().await;
    let answer = channel
        .lease
        .renew_confirmed(Duration::from_secs(30), 1, Duration::from_millis(100))
        .await;
    assert_eq!(
        answer,
        Err(LeaseError::Unanswered(Duration::from_millis(100)))
    );
}

#[tokio::test]
async fn the_writer_sends_whole_lines_only_and_refuses_the_control_prefix() {
    let (_dir, mut channel, mut init) = pair().await;
    channel.writer.write_all(b"{\"half\":").await.unwrap();
    channel.writer.flush().await.unwrap();
    channel
        .writer
        .write_all(b"1}\n{\"next\":2}\n")
        .await
        .unwrap();
    assert_eq!(next_line_from_host(&mut init).await, "{\"half\":1}\n");
    assert_eq!(next_line_from_host(&mut init).await, "{\"next\":2}\n");
    let refused = channel
        .writer
        .write_all(b"!{\"lease\":{\"ttlMs\":1,\"epoch\":99}}\n")
        .await;
    assert_eq!(
        refused.map_err(|e| e.kind()),
        Err(io::ErrorKind::InvalidData)
    );
    channel.writer.shutdown().await.unwrap();
    assert_eq!(
        next_line_from_host(&mut init).await,
        "!{\"closeStdin\":{}}\n"
    );
    let after = channel.writer.write_all(b"{}\n").await;
    assert_eq!(after.map_err(|e| e.kind()), Err(io::ErrorKind::BrokenPipe));
}

#[tokio::test]
async fn a_host_that_dies_mid_line_sends_nothing_of_it() {
    let (_dir, mut channel, mut init) = pair().await;
    channel
        .writer
        .write_all(b"{\"whole\":1}\n{\"cut\":")
        .await
        .unwrap();
    drop(channel);
    assert_eq!(next_line_from_host(&mut init).await, "{\"whole\":1}\n");
    assert_eq!(
        init.reader.next_line().await.unwrap(),
        LineEvent::End { partial: 0 }
    );
}

#[tokio::test]
async fn release_completes_after_the_last_line_and_the_reader_ends() {
    let (_dir, channel, mut init) = pair().await;
    let UnitChannel {
        reader,
        lease,
        ended,
        ..
    } = channel;
    let release = tokio::spawn(lease.release());
    assert_eq!(next_line_from_host(&mut init).await, "!{\"release\":{}}\n");
    init.writer
        .write_all(b"{\"last\":1}\n!{\"released\":{}}\n{\"too late\":1}\n")
        .await
        .unwrap();
    let mut lines = reader.lines();
    assert_eq!(
        lines.next_line().await.unwrap().as_deref(),
        Some("{\"last\":1}")
    );
    assert_eq!(lines.next_line().await.unwrap(), None);
    assert_eq!(release.await.unwrap(), Ok(()));
    assert_eq!(ended.wait().await, UnitEnd::Released);
}

#[tokio::test]
async fn the_exit_report_ends_the_channel() {
    let (_dir, channel, mut init) = pair().await;
    init.writer
        .write_all(b"{\"x\":1}\n!{\"ended\":{\"reason\":\"executorExited\",\"executor\":{\"code\":3},\"killed\":0,\"exitCode\":3}}\n")
        .await
        .unwrap();
    let mut reader = channel.reader;
    let mut everything = String::new();
    reader.read_to_string(&mut everything).await.unwrap();
    assert_eq!(everything, "{\"x\":1}\n");
    assert_eq!(
        channel.ended.wait().await,
        UnitEnd::Reported(EndReport {
            reason: EndReason::ExecutorExited,
            executor: Some(ExitReport::Code(3)),
            killed: 0,
            exit_code: 3,
        })
    );
}

#[tokio::test]
async fn a_dropped_connection_ends_the_channel_as_disconnected() {
    let (_dir, channel, init) = pair().await;
    drop(init);
    assert_eq!(channel.ended.wait().await, UnitEnd::Disconnected);
    let renewal = channel
        .lease
        .renew_confirmed(Duration::from_secs(1), 1, Duration::from_secs(5))
        .await;
    assert_eq!(renewal, Err(LeaseError::Ended(UnitEnd::Disconnected)));
}

#[test]
fn bind_replaces_a_stale_socket_but_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(SOCKET_NAME);
    let _stale = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let listener = bind(dir.path()).unwrap();
        let mode = std::fs::metadata(listener.path())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o666);
    });
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, "not a socket").unwrap();
    let error = runtime.block_on(async { bind(dir.path()).err().map(|e| e.to_string()) });
    assert_eq!(
        error,
        Some(format!(
            "{} exists and is not a socket; refusing to replace it",
            path.display()
        ))
    );
}

#[test]
fn a_socket_path_too_long_for_sun_path_is_refused_clearly() {
    let long = std::path::PathBuf::from(format!("/tmp/{}", "d".repeat(120)));
    let error = bind(&long).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(
        error.contains("longer than the 107 a Unix socket allows"),
        "{error}"
    );
}
