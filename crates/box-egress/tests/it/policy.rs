//! A running unit's list narrowed and restored (`box/network.set`).

use box_egress::AllowList;
use pretty_assertions::assert_eq;
use tokio::io::AsyncWriteExt;

use crate::client_hello::ClientHello;
use crate::support::{
    ALLOWED, HttpUpstream, Setup, TlsUpstream, connect, decision, read_response, read_to_end,
};

#[tokio::test]
async fn a_narrowed_list_holds_for_new_connections_and_restores_up_to_the_bound() {
    let upstream = TlsUpstream::start().await;
    let port = upstream.port;
    let entry = format!("{ALLOWED}:{port}");
    let mut proxy = Setup::new(&[&entry])
        .bound(&[&entry, "extra.test"])
        .tls_port(port)
        .start();

    // A tunnel opened before the change stays open.
    let mut open = proxy.connect().await;
    assert_eq!(connect(&mut open, &entry).await.0, 200);

    let narrowed = proxy.handle.set_allow(AllowList::default()).unwrap();
    assert_eq!(narrowed, AllowList::default());
    let mut refused = proxy.connect().await;
    assert_eq!(connect(&mut refused, &entry).await.0, 403);
    assert_eq!(decision(&proxy.event().await), "refused not-allowed");

    open.write_all(&ClientHello::new(Some(ALLOWED)).bytes())
        .await
        .unwrap();
    assert_eq!(read_to_end(&mut open).await, b"served");
    drop(open);
    assert_eq!(decision(&proxy.event().await), format!("allowed {entry}"));

    // Restored, and widened within the bound: answered with the new list.
    let restored = proxy
        .handle
        .set_allow(AllowList::parse([&entry, "extra.test"]).unwrap())
        .unwrap();
    assert_eq!(restored.to_string(), format!("[{entry}, extra.test]"));
    let mut stream = proxy.connect().await;
    assert_eq!(connect(&mut stream, &entry).await.0, 200);

    // Past the bound: refused, and the list in force is unchanged.
    let error = proxy
        .handle
        .set_allow(AllowList::parse(["other.test"]).unwrap())
        .unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("network.allow: other.test allows more than the profile's bound"),
        "{error}"
    );
    assert_eq!(proxy.handle.allow(), restored);
}

#[tokio::test]
async fn a_keep_alive_connection_is_judged_by_the_list_in_force_at_each_request() {
    let upstream = HttpUpstream::start().await;
    let port = upstream.port;
    let entry = format!("{ALLOWED}:{port}");
    let mut proxy = Setup::new(&[&entry]).start();
    let mut stream = proxy.connect().await;
    let request = format!("GET http://{entry}/ HTTP/1.1\r\nHost: {entry}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    assert_eq!(read_response(&mut stream).await.0, 200);
    assert_eq!(decision(&proxy.event().await), format!("allowed {entry}"));
    proxy.handle.set_allow(AllowList::default()).unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    assert_eq!(read_response(&mut stream).await.0, 403);
    assert_eq!(decision(&proxy.event().await), "refused not-allowed");
    assert_eq!(upstream.requests().len(), 1);
}
