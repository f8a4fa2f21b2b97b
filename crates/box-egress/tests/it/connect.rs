//! `CONNECT` tunnels: which targets are allowed, and the TLS server-name checks.

use box_egress::{Decision, PrivateDestinations, Refusal};
use pretty_assertions::assert_eq;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

use crate::client_hello::ClientHello;
use crate::support::{ALLOWED, Setup, TlsUpstream, connect, decision, read_to_end};

const ALERT_UNRECOGNIZED_NAME: [u8; 7] = [21, 3, 3, 0, 2, 2, 112];

#[tokio::test]
async fn an_allowed_name_tunnels_its_client_hello_intact() {
    let upstream = TlsUpstream::start().await;
    let port = upstream.port;
    let mut proxy = Setup::new(&[&format!("{ALLOWED}:{port}")])
        .tls_port(port)
        .start();
    let mut stream = proxy.connect().await;
    assert_eq!(
        connect(&mut stream, &format!("Allowed.TEST.:{port}")).await,
        (200, String::new())
    );
    let hello = ClientHello::new(Some("allowed.test")).bytes();
    stream.write_all(&hello).await.unwrap();
    assert_eq!(read_to_end(&mut stream).await, b"served");
    drop(stream);
    assert_eq!(upstream.hellos(), vec![hello.clone()]);
    let event = proxy.event().await;
    assert_eq!(decision(&event), format!("allowed {ALLOWED}:{port}"));
    assert_eq!(
        (
            event.method.as_str(),
            event.host.as_str(),
            event.port,
            event.sni.as_deref()
        ),
        ("CONNECT", ALLOWED, port, Some(ALLOWED))
    );
    assert_eq!(event.address, Some(crate::support::loopback(port)));
    assert_eq!((event.bytes_up, event.bytes_down), (hello.len() as u64, 6));
    assert_eq!(
        (event.session.as_str(), event.unit.as_str()),
        ("session-1", "work")
    );
}

#[tokio::test]
async fn a_client_hello_cut_into_records_and_single_bytes_is_read_whole() {
    let upstream = TlsUpstream::start().await;
    let port = upstream.port;
    let mut proxy = Setup::new(&[&format!("{ALLOWED}:{port}")])
        .tls_port(port)
        .start();
    let mut stream = proxy.connect().await;
    assert_eq!(
        connect(&mut stream, &format!("{ALLOWED}:{port}")).await.0,
        200
    );
    // A hello the size of a post-quantum one, in two records, the first 60 bytes one
    // write at a time.
    let hello = ClientHello::new(Some(ALLOWED)).padding(1800).records(1000);
    for byte in &hello[..60] {
        stream.write_all(&[*byte]).await.unwrap();
        stream.flush().await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    stream.write_all(&hello[60..]).await.unwrap();
    assert_eq!(read_to_end(&mut stream).await, b"served");
    // The tunnel is reported when both directions have ended.
    drop(stream);
    assert_eq!(upstream.hellos(), vec![hello]);
    assert_eq!(
        decision(&proxy.event().await),
        format!("allowed {ALLOWED}:{port}")
    );
}

#[tokio::test]
async fn a_server_name_other_than_the_connect_host_is_refused_with_an_alert() {
    let upstream = TlsUpstream::start().await;
    let port = upstream.port;
    let mut proxy = Setup::new(&[&format!("{ALLOWED}:{port}")])
        .tls_port(port)
        .start();
    let mut stream = proxy.connect().await;
    assert_eq!(
        connect(&mut stream, &format!("{ALLOWED}:{port}")).await.0,
        200
    );
    stream
        .write_all(&ClientHello::new(Some("forbidden.example")).bytes())
        .await
        .unwrap();
    assert_eq!(read_to_end(&mut stream).await, ALERT_UNRECOGNIZED_NAME);
    assert_eq!(upstream.hellos(), Vec::<Vec<u8>>::new());
    let event = proxy.event().await;
    assert_eq!(
        event.decision,
        Decision::Refused(Refusal::SniMismatch {
            sni: "forbidden.example".to_owned()
        })
    );
    assert_eq!(
        (event.sni.as_deref(), event.bytes_up),
        (Some("forbidden.example"), 0)
    );
}

#[tokio::test]
async fn a_client_hello_without_a_server_name_is_refused_on_a_tls_port() {
    let upstream = TlsUpstream::start().await;
    let port = upstream.port;
    let mut proxy = Setup::new(&[&format!("{ALLOWED}:{port}")])
        .tls_port(port)
        .start();
    let mut stream = proxy.connect().await;
    assert_eq!(
        connect(&mut stream, &format!("{ALLOWED}:{port}")).await.0,
        200
    );
    stream
        .write_all(&ClientHello::new(None).bytes())
        .await
        .unwrap();
    assert_eq!(read_to_end(&mut stream).await, ALERT_UNRECOGNIZED_NAME);
    assert_eq!(decision(&proxy.event().await), "refused sni-missing");
    assert!(upstream.hellos().is_empty());
}

#[tokio::test]
async fn bytes_that_are_not_tls_are_refused_on_a_tls_port() {
    let upstream = TlsUpstream::start().await;
    let port = upstream.port;
    let mut proxy = Setup::new(&[&format!("{ALLOWED}:{port}")])
        .tls_port(port)
        .start();
    let mut stream = proxy.connect().await;
    assert_eq!(
        connect(&mut stream, &format!("{ALLOWED}:{port}")).await.0,
        200
    );
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(read_to_end(&mut stream).await, b"");
    assert_eq!(decision(&proxy.event().await), "refused not-tls");
    assert!(upstream.hellos().is_empty());
}

#[tokio::test]
async fn a_client_hello_that_never_ends_times_out() {
    let upstream = TlsUpstream::start().await;
    let port = upstream.port;
    let mut proxy = Setup::new(&[&format!("{ALLOWED}:{port}")])
        .tls_port(port)
        .start();
    let mut stream = proxy.connect().await;
    assert_eq!(
        connect(&mut stream, &format!("{ALLOWED}:{port}")).await.0,
        200
    );
    let hello = ClientHello::new(Some(ALLOWED)).bytes();
    stream.write_all(&hello[..20]).await.unwrap();
    assert_eq!(read_to_end(&mut stream).await, b"");
    assert_eq!(
        decision(&proxy.event().await),
        "refused client-hello-timeout"
    );
}

#[tokio::test]
async fn other_ports_pass_other_protocols_but_hold_a_client_hello_to_the_host() {
    // A server that speaks first (like SSH) on a port that is not a TLS port.
    let upstream = TlsUpstream::start_with_banner(Some("SSH-2.0-test\r\n")).await;
    let port = upstream.port;
    let mut proxy = Setup::new(&[&format!("{ALLOWED}:{port}")]).start();
    let mut stream = proxy.connect().await;
    assert_eq!(
        connect(&mut stream, &format!("{ALLOWED}:{port}")).await.0,
        200
    );
    let banner = crate::support::read_head_line(&mut stream).await;
    assert_eq!(banner, "SSH-2.0-test\r\n");
    stream.write_all(b"ping\n").await.unwrap();
    assert_eq!(read_to_end(&mut stream).await, b"ping\n");
    drop(stream);
    assert_eq!(
        decision(&proxy.event().await),
        format!("allowed {ALLOWED}:{port}")
    );

    let mut stream = proxy.connect().await;
    assert_eq!(
        connect(&mut stream, &format!("{ALLOWED}:{port}")).await.0,
        200
    );
    crate::support::read_head_line(&mut stream).await;
    stream
        .write_all(&ClientHello::new(Some("cdn.example")).bytes())
        .await
        .unwrap();
    let rest = read_to_end(&mut stream).await;
    assert!(rest.ends_with(&ALERT_UNRECOGNIZED_NAME), "{rest:?}");
    assert_eq!(decision(&proxy.event().await), "refused sni-mismatch");
}

#[tokio::test]
async fn names_not_allowed_are_refused_with_403_naming_the_reason() {
    let upstream = TlsUpstream::start().await;
    let port = upstream.port;
    let mut proxy = Setup::new(&[&format!("{ALLOWED}:{port}"), "*.example.com"])
        .pin("other.test", "127.0.0.1")
        .start();
    for (target, reason) in [
        (format!("other.test:{port}"), "not-allowed"),
        (
            format!("{ALLOWED}:{}", port.wrapping_add(1).max(1)),
            "not-allowed",
        ),
        ("example.com:443".to_owned(), "not-allowed"),
        ("www.example.com:22".to_owned(), "not-allowed"),
    ] {
        let mut stream = proxy.connect().await;
        let (status, body) = connect(&mut stream, &target).await;
        assert_eq!(status, 403, "{target}");
        assert!(
            body.starts_with(&format!("box egress refused {target}: {reason}: ")),
            "{body}"
        );
        assert_eq!(body.lines().count(), 1, "{body}");
        let event = proxy.event().await;
        assert_eq!(decision(&event), format!("refused {reason}"), "{target}");
    }
    assert!(upstream.hellos().is_empty());
}

#[tokio::test]
async fn ip_literals_and_odd_spellings_are_never_names() {
    let upstream = TlsUpstream::start().await;
    let port = upstream.port;
    // `allowed.test` is allowed, and pinned to 127.0.0.1, but the address itself is not.
    let mut proxy = Setup::new(&[&format!("{ALLOWED}:{port}"), "localhost", "*.nip.io"]).start();
    for (target, reason) in [
        (format!("127.0.0.1:{port}"), "not-allowed"),
        (format!("[::1]:{port}"), "not-allowed"),
        ("[::ffff:169.254.169.254]:80".to_owned(), "not-allowed"),
        ("[::ffff:127.0.0.1]:80".to_owned(), "not-allowed"),
        ("2130706433:80".to_owned(), "bad-host"),
        ("127.1:80".to_owned(), "bad-host"),
        ("0x7f000001:80".to_owned(), "bad-host"),
        ("0:80".to_owned(), "bad-host"),
        ("0177.0.0.1:80".to_owned(), "bad-host"),
        ("[fe80::1%25eth0]:80".to_owned(), "bad-host"),
        ("xn--nxasmq6b.example:443".to_owned(), "not-allowed"),
        ("bücher.example:443".to_owned(), "bad-host"),
        ("allowed.test".to_owned(), "bad-host"),
    ] {
        let mut stream = proxy.connect().await;
        let (status, body) = connect(&mut stream, &target).await;
        assert_eq!(status, 403, "{target}: {body}");
        assert_eq!(
            decision(&proxy.event().await),
            format!("refused {reason}"),
            "{target}"
        );
    }
    assert!(upstream.hellos().is_empty());
}

#[tokio::test]
async fn names_that_resolve_to_loopback_are_refused_without_private_destinations() {
    let upstream = TlsUpstream::start().await;
    let port = upstream.port;
    let mut proxy = Setup::new(&[
        &format!("{ALLOWED}:{port}"),
        &format!("localhost:{port}"),
        "*.nip.io",
    ])
    .private(PrivateDestinations::Refused)
    .start();
    // A pin, the host's resolver (/etc/hosts), and a trailing dot: all loopback.
    for target in [
        format!("{ALLOWED}:{port}"),
        format!("localhost:{port}"),
        format!("LOCALHOST.:{port}"),
    ] {
        let mut stream = proxy.connect().await;
        let (status, body) = connect(&mut stream, &target).await;
        assert_eq!(status, 403, "{target}");
        assert!(body.contains("a loopback address"), "{body}");
        assert!(
            body.contains("allow_dangerous = [\"private-destinations\"]"),
            "{body}"
        );
        let event = proxy.event().await;
        assert_eq!(decision(&event), "refused forbidden-address", "{target}");
    }
    assert!(upstream.hellos().is_empty());
}

#[tokio::test]
async fn a_pinned_name_on_a_private_address_is_refused_unless_private_destinations_are_allowed() {
    let upstream = TlsUpstream::start().await;
    let port = upstream.port;
    let allow = [format!("{ALLOWED}:{port}")];
    let allow: Vec<&str> = allow.iter().map(String::as_str).collect();
    let mut refused = Setup::new(&allow)
        .private(PrivateDestinations::Refused)
        .start();
    let mut stream = refused.connect().await;
    assert_eq!(connect(&mut stream, allow[0]).await.0, 403);
    assert_eq!(
        refused.event().await.decision,
        Decision::Refused(Refusal::ForbiddenAddress {
            address: "127.0.0.1".parse().unwrap(),
            range: box_egress::AddressRange::Loopback
        })
    );
    let mut allowed = Setup::new(&allow).tls_port(port).start();
    let mut stream = allowed.connect().await;
    assert_eq!(connect(&mut stream, allow[0]).await.0, 200);
    stream
        .write_all(&ClientHello::new(Some(ALLOWED)).bytes())
        .await
        .unwrap();
    assert_eq!(read_to_end(&mut stream).await, b"served");
    drop(stream);
    assert_eq!(allowed.event().await.decision.outcome(), "allowed");
}

#[tokio::test]
async fn metadata_is_refused_even_with_private_destinations() {
    let mut proxy = Setup::new(&[
        "metadata.test",
        "metadata6.test",
        "alibaba.test",
        "gcp6.test",
        "169.254.169.254",
        "[fd00:ec2::254]",
        "[::ffff:169.254.169.254]",
        "169.254.170.2",
    ])
    .pin("metadata.test", "169.254.169.254")
    .pin("metadata6.test", "fd00:ec2::254")
    .pin("alibaba.test", "100.100.100.200")
    .pin("gcp6.test", "fd20:ce::254")
    .start();
    for target in [
        "metadata.test:80",
        "metadata6.test:80",
        "alibaba.test:80",
        "gcp6.test:80",
        "169.254.169.254:80",
        "[fd00:ec2::254]:80",
        "[::ffff:169.254.169.254]:80",
        "169.254.170.2:80",
    ] {
        let mut stream = proxy.connect().await;
        let (status, body) = connect(&mut stream, target).await;
        assert_eq!(status, 403, "{target}");
        assert!(
            body.contains("a cloud metadata address, refused always"),
            "{body}"
        );
        assert_eq!(decision(&proxy.event().await), "refused forbidden-address");
    }
}

/// Shared (carrier-grade NAT), documentation (TEST-NET) and reserved (240/4)
/// addresses are where real networks put registries: refused without the
/// operator's `private-destinations`, connected to with it, while the
/// metadata address inside the shared range stays refused.
#[tokio::test]
async fn shared_documentation_and_reserved_addresses_are_private_destinations() {
    let allow = [
        "cgnat.test",
        "testnet.test",
        "testnet6.test",
        "classe.test",
        "alibaba.test",
    ];
    let pins = [
        (
            "cgnat.test",
            "100.64.1.2",
            "a shared (carrier-grade NAT) address",
        ),
        (
            "testnet.test",
            "203.0.113.10",
            "a documentation (TEST-NET) address",
        ),
        (
            "testnet6.test",
            "2001:db8::10",
            "a documentation (TEST-NET) address",
        ),
        ("classe.test", "240.1.2.3", "a reserved (240/4) address"),
    ];
    let setup = |private| {
        let mut setup = Setup::new(&allow)
            .private(private)
            .pin("alibaba.test", "100.100.100.200")
            .connect_timeout(Duration::from_millis(500));
        for (name, address, _) in pins {
            setup = setup.pin(name, address);
        }
        setup.start()
    };
    let mut refused = setup(PrivateDestinations::Refused);
    for (name, _, range) in pins {
        let mut stream = refused.connect().await;
        let (status, body) = connect(&mut stream, &format!("{name}:80")).await;
        assert_eq!(status, 403, "{name}: {body}");
        assert!(body.contains(range), "{name}: {body}");
        assert!(
            body.contains("allow_dangerous = [\"private-destinations\"]"),
            "{body}"
        );
        assert_eq!(
            decision(&refused.event().await),
            "refused forbidden-address"
        );
    }
    // With the consent the proxy connects: whether anything answers there
    // depends on the machine's network (a 200 or a 502), never a refusal.
    let mut allowed = setup(PrivateDestinations::Allowed);
    for (name, _, _) in pins {
        let mut stream = allowed.connect().await;
        let (status, body) = connect(&mut stream, &format!("{name}:80")).await;
        assert!(status == 200 || status == 502, "{name}: {status} {body}");
        drop(stream);
        let event = allowed.event().await;
        assert_ne!(event.decision.outcome(), "refused", "{name}: {event:?}");
    }
    let mut stream = allowed.connect().await;
    let (status, body) = connect(&mut stream, "alibaba.test:80").await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body.contains("a cloud metadata address, refused always"),
        "{body}"
    );
}

#[tokio::test]
async fn an_upstream_that_does_not_answer_is_a_502() {
    let port = crate::support::closed_port().await;
    let mut proxy = Setup::new(&[&format!("{ALLOWED}:{port}")]).start();
    let mut stream = proxy.connect().await;
    let (status, body) = connect(&mut stream, &format!("{ALLOWED}:{port}")).await;
    assert_eq!(status, 502);
    assert!(
        body.contains("connect-failed: cannot connect to 127.0.0.1"),
        "{body}"
    );
    assert_eq!(decision(&proxy.event().await), "failed connect-failed");
}

#[tokio::test]
async fn malformed_and_oversized_heads_are_refused() {
    let mut proxy = Setup::new(&[ALLOWED]).start();
    let mut stream = proxy.connect().await;
    let long = format!(
        "CONNECT {ALLOWED}:443 HTTP/1.1\r\nX: {}\r\n\r\n",
        "a".repeat(9000)
    );
    stream.write_all(long.as_bytes()).await.unwrap();
    let (status, _, _) = crate::support::read_response(&mut stream).await;
    assert_eq!(status, 431);
    assert_eq!(decision(&proxy.event().await), "refused head-too-large");
    let mut stream = proxy.connect().await;
    stream
        .write_all(b"\x16\x03\x01\x00\x05hello\r\n\r\n")
        .await
        .unwrap();
    let (status, _, _) = crate::support::read_response(&mut stream).await;
    assert_eq!(status, 400);
    assert_eq!(decision(&proxy.event().await), "refused bad-request");
    // A client that connects and leaves without a byte is no attempt.
    drop(proxy.connect().await);
    assert!(proxy.no_more_events().await);
}
