//! Plain HTTP through the proxy: absolute-form requests, judged one by one.

use pretty_assertions::assert_eq;
use tokio::io::AsyncWriteExt;

use crate::support::{ALLOWED, HttpUpstream, Setup, decision, read_response, read_to_end};

#[tokio::test]
async fn an_allowed_request_is_forwarded_in_origin_form() {
    let upstream = HttpUpstream::start().await;
    let port = upstream.port;
    let mut proxy = Setup::new(&[&format!("{ALLOWED}:{port}")]).start();
    let mut stream = proxy.connect().await;
    let request = format!(
        "GET http://Allowed.test:{port}/path?q=1 HTTP/1.1\r\nHost: allowed.test:{port}\r\nProxy-Authorization: Basic c2VjcmV0\r\nProxy-Connection: keep-alive\r\nAccept: */*\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let (status, _, body) = read_response(&mut stream).await;
    assert_eq!((status, body.as_str()), (200, "hello /path?q=1"));
    let recorded = upstream.requests();
    assert_eq!(recorded.len(), 1);
    assert_eq!(recorded[0].line, "GET /path?q=1 HTTP/1.1");
    assert_eq!(
        recorded[0].header("host"),
        Some(format!("allowed.test:{port}").as_str())
    );
    assert_eq!(recorded[0].header("proxy-authorization"), None);
    assert_eq!(recorded[0].header("proxy-connection"), None);
    assert_eq!(recorded[0].header("accept"), Some("*/*"));
    let event = proxy.event().await;
    assert_eq!(decision(&event), format!("allowed {ALLOWED}:{port}"));
    assert_eq!(
        (event.method.as_str(), event.host.as_str(), event.port),
        ("GET", ALLOWED, port)
    );
    assert!(event.bytes_up > 0 && event.bytes_down > 0, "{event:?}");
}

#[tokio::test]
async fn every_request_on_a_keep_alive_connection_is_judged() {
    let upstream = HttpUpstream::start().await;
    let port = upstream.port;
    let mut proxy = Setup::new(&[&format!("{ALLOWED}:{port}")])
        .pin("forbidden.test", "127.0.0.1")
        .start();
    let mut stream = proxy.connect().await;
    for path in ["/one", "/two"] {
        let request =
            format!("GET http://{ALLOWED}:{port}{path} HTTP/1.1\r\nHost: {ALLOWED}:{port}\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let (status, _, body) = read_response(&mut stream).await;
        assert_eq!((status, body), (200, format!("hello {path}")));
        assert_eq!(
            decision(&proxy.event().await),
            format!("allowed {ALLOWED}:{port}")
        );
    }
    // The same connection, now naming a host the list does not allow.
    let request = format!(
        "GET http://forbidden.test:{port}/three HTTP/1.1\r\nHost: forbidden.test:{port}\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let (status, head, body) = read_response(&mut stream).await;
    assert_eq!(status, 403);
    assert!(head.contains("Connection: close"), "{head}");
    assert!(
        body.starts_with(&format!(
            "box egress refused forbidden.test:{port}: not-allowed"
        )),
        "{body}"
    );
    assert_eq!(read_to_end(&mut stream).await, b"");
    assert_eq!(decision(&proxy.event().await), "refused not-allowed");
    assert_eq!(upstream.requests().len(), 2);
}

#[tokio::test]
async fn pipelined_requests_are_judged_one_by_one() {
    let upstream = HttpUpstream::start().await;
    let port = upstream.port;
    let mut proxy = Setup::new(&[&format!("{ALLOWED}:{port}")]).start();
    let mut stream = proxy.connect().await;
    let requests = format!(
        "GET http://{ALLOWED}:{port}/a HTTP/1.1\r\n\r\nGET http://{ALLOWED}:{}/b HTTP/1.1\r\n\r\n",
        port.wrapping_add(1).max(1)
    );
    stream.write_all(requests.as_bytes()).await.unwrap();
    assert_eq!(read_response(&mut stream).await.0, 200);
    assert_eq!(read_response(&mut stream).await.0, 403);
    assert_eq!(
        decision(&proxy.event().await),
        format!("allowed {ALLOWED}:{port}")
    );
    assert_eq!(decision(&proxy.event().await), "refused not-allowed");
    // The Host header the upstream saw was added from the URL.
    assert_eq!(
        upstream.requests()[0].header("host"),
        Some(format!("{ALLOWED}:{port}").as_str())
    );
}

#[tokio::test]
async fn a_host_header_naming_another_authority_is_refused() {
    let upstream = HttpUpstream::start().await;
    let port = upstream.port;
    let mut proxy = Setup::new(&[&format!("{ALLOWED}:{port}")]).start();
    for host in [
        "evil.example",
        &format!("{ALLOWED}:{}", port.wrapping_add(1).max(1)),
        ALLOWED,
        "127.0.0.1",
    ] {
        let mut stream = proxy.connect().await;
        let request = format!("GET http://{ALLOWED}:{port}/ HTTP/1.1\r\nHost: {host}\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let (status, _, body) = read_response(&mut stream).await;
        assert_eq!(status, 403, "{host}");
        assert!(body.contains("host-mismatch"), "{body}");
        assert_eq!(decision(&proxy.event().await), "refused host-mismatch");
    }
    let mut stream = proxy.connect().await;
    let request = format!(
        "GET http://{ALLOWED}:{port}/ HTTP/1.1\r\nHost: {ALLOWED}:{port}\r\nHost: evil.example\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    assert_eq!(read_response(&mut stream).await.0, 400);
    assert_eq!(decision(&proxy.event().await), "refused bad-request");
    assert!(upstream.requests().is_empty());
}

#[tokio::test]
async fn requests_that_are_not_absolute_http_are_refused() {
    let upstream = HttpUpstream::start().await;
    let port = upstream.port;
    let mut proxy = Setup::new(&[&format!("{ALLOWED}:{port}"), ALLOWED]).start();
    for (request, status, reason) in [
        (
            format!("GET / HTTP/1.1\r\nHost: {ALLOWED}:{port}\r\n\r\n"),
            400,
            "bad-request",
        ),
        (
            format!("GET https://{ALLOWED}/ HTTP/1.1\r\n\r\n"),
            400,
            "bad-request",
        ),
        (
            format!("GET http://user@{ALLOWED}:{port}/ HTTP/1.1\r\n\r\n"),
            400,
            "bad-request",
        ),
        (
            "GET http://2130706433/ HTTP/1.1\r\n\r\n".to_owned(),
            403,
            "bad-host",
        ),
        (
            "GET http://127.0.0.1/ HTTP/1.1\r\n\r\n".to_owned(),
            403,
            "not-allowed",
        ),
        (
            format!(
                "POST http://{ALLOWED}:{port}/ HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
            ),
            400,
            "bad-request",
        ),
    ] {
        let mut stream = proxy.connect().await;
        stream.write_all(request.as_bytes()).await.unwrap();
        let (got, _, body) = read_response(&mut stream).await;
        assert_eq!(got, status, "{request}: {body}");
        assert_eq!(
            decision(&proxy.event().await),
            format!("refused {reason}"),
            "{request}"
        );
    }
    assert!(upstream.requests().is_empty());
}

#[tokio::test]
async fn request_bodies_are_forwarded_and_100_continue_is_answered() {
    let upstream = HttpUpstream::start().await;
    let port = upstream.port;
    let mut proxy = Setup::new(&[&format!("{ALLOWED}:{port}")]).start();
    let mut stream = proxy.connect().await;
    let request = format!(
        "POST http://{ALLOWED}:{port}/upload HTTP/1.1\r\nContent-Length: 11\r\nExpect: 100-continue\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let interim = crate::support::read_head(&mut stream).await;
    assert!(interim.starts_with("HTTP/1.1 100 Continue"), "{interim}");
    stream.write_all(b"hello world").await.unwrap();
    let (status, _, _) = read_response(&mut stream).await;
    assert_eq!(status, 200);
    let recorded = upstream.requests();
    assert_eq!(recorded[0].body, "hello world");
    assert_eq!(recorded[0].header("expect"), None);
    assert_eq!(
        decision(&proxy.event().await),
        format!("allowed {ALLOWED}:{port}")
    );
}
