//! Per-unit limits: connections at once, and bandwidth shared by every connection.

use std::num::{NonZeroU64, NonZeroUsize};
use std::time::{Duration, Instant};

use box_egress::Limits;
use pretty_assertions::assert_eq;

use crate::support::{ALLOWED, Setup, bulk_upstream, connect, decision, read_to_end};

#[tokio::test]
async fn connections_over_the_limit_are_answered_429() {
    let (port, _server) = bulk_upstream(0).await;
    let mut proxy = Setup::new(&[&format!("{ALLOWED}:{port}")])
        .limits(Limits {
            max_connections: NonZeroUsize::new(1).unwrap(),
            bytes_per_second: None,
        })
        .start();
    let mut held = proxy.connect().await;
    assert_eq!(
        connect(&mut held, &format!("{ALLOWED}:{port}")).await.0,
        200
    );
    let mut over = proxy.connect().await;
    let (status, body) = connect(&mut over, &format!("{ALLOWED}:{port}")).await;
    assert_eq!(status, 429);
    assert!(
        body.contains("too-many-connections: the unit already has 1 connections open"),
        "{body}"
    );
    assert_eq!(
        decision(&proxy.event().await),
        "refused too-many-connections"
    );
    // The held tunnel ends (the server sent nothing and closed); its permit returns.
    assert_eq!(read_to_end(&mut held).await, b"");
    drop(held);
    assert_eq!(
        decision(&proxy.event().await),
        format!("allowed {ALLOWED}:{port}")
    );
    let mut again = proxy.connect().await;
    assert_eq!(
        connect(&mut again, &format!("{ALLOWED}:{port}")).await.0,
        200
    );
}

#[tokio::test]
async fn bandwidth_is_capped_across_parallel_connections() {
    const RATE: usize = 256 * 1024;
    let (port, _server) = bulk_upstream(RATE).await;
    let mut proxy = Setup::new(&[&format!("{ALLOWED}:{port}")])
        .limits(Limits {
            bytes_per_second: NonZeroU64::new(RATE as u64),
            ..Limits::default()
        })
        .start();
    // Three downloads of one second's worth each, at once: the first second's worth is
    // the bucket's burst, the other two take two seconds between them.
    let start = Instant::now();
    let downloads: Vec<_> = (0..3)
        .map(|_| {
            let socket = proxy.socket.clone();
            tokio::spawn(async move {
                let mut stream = tokio::net::UnixStream::connect(socket).await.unwrap();
                assert_eq!(
                    connect(&mut stream, &format!("{ALLOWED}:{port}")).await.0,
                    200
                );
                read_to_end(&mut stream).await.len()
            })
        })
        .collect();
    for download in downloads {
        assert_eq!(download.await.unwrap(), RATE);
    }
    let elapsed = start.elapsed();
    assert!(elapsed >= Duration::from_millis(1800), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(6), "{elapsed:?}");
    // The wait is reported: about the two seconds past the burst, summed
    // over the senders that queued for it.
    let waited = Duration::from_nanos(proxy.throttled.load(std::sync::atomic::Ordering::Relaxed));
    assert!(waited >= Duration::from_millis(1500), "{waited:?}");
    for _ in 0..3 {
        let event = proxy.event().await;
        assert_eq!(event.bytes_down, RATE as u64);
    }
}

#[tokio::test]
async fn a_request_head_must_be_whole_within_the_head_timeout_from_accept() {
    use tokio::io::AsyncWriteExt;
    let mut proxy = Setup::new(&[ALLOWED])
        .head_timeout(Duration::from_secs(2))
        .start();
    let mut client = proxy.connect().await;
    let accepted = Instant::now();
    // A head that starts late and never ends: the first read (which tells a
    // handoff from a request) must not restart the clock.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    client
        .write_all(format!("GET http://{ALLOWED}/ HTTP/1.1\r\nHost: {ALLOWED}\r\n").as_bytes())
        .await
        .unwrap();
    let answer = String::from_utf8(read_to_end(&mut client).await).unwrap();
    let took = accepted.elapsed();
    assert!(answer.starts_with("HTTP/1.1 408 "), "{answer}");
    assert!(
        took < Duration::from_millis(3200),
        "the 408 came {took:?} after accept, past the 2 s head timeout"
    );
    assert_eq!(decision(&proxy.event().await), "refused head-timeout");
}
