//! The listener handoff, from both sides: the bridge against a proxy written here
//! (what it sends, when it stops accepting, when it takes the listener back), the
//! proxy against hostile offers, and the real pair with `curl`.

use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener as StdUnixListener, UnixStream as StdUnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use box_egress::bridge;
use pretty_assertions::assert_eq;
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::bridge::curl;
use crate::support::{ALLOWED, HttpUpstream, PATIENCE, Setup, decision, read_response, tool};

/// What the bridge sends with its listener.
const PREFACE: &[u8] = b"BOX-EGRESS-LISTENER/1\n";

/// One message on `stream`, with the descriptors it carried.
fn receive(stream: &StdUnixStream) -> (Vec<u8>, Vec<OwnedFd>) {
    let mut buffer = [0; 4096];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(4))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let message = rustix::net::recvmsg(
        stream,
        &mut [IoSliceMut::new(&mut buffer)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )
    .unwrap();
    let mut fds = Vec::new();
    for ancillary in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = ancillary {
            fds.extend(received);
        }
    }
    (buffer[..message.bytes].to_vec(), fds)
}

/// Offer `fd` to the proxy at `socket` as a bridge would; the connection, and
/// the proxy's answer line.
fn offer(socket: &Path, fd: Option<BorrowedFd<'_>>) -> (StdUnixStream, String) {
    let mut stream = StdUnixStream::connect(socket).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    let fds: Vec<BorrowedFd<'_>> = fd.into_iter().collect();
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() {
        assert!(control.push(SendAncillaryMessage::ScmRights(&fds)));
    }
    let sent = rustix::net::sendmsg(
        &stream,
        &[IoSlice::new(PREFACE)],
        &mut control,
        SendFlags::empty(),
    )
    .unwrap();
    assert_eq!(sent, PREFACE.len());
    let mut answer = Vec::new();
    let mut byte = [0; 1];
    while !answer.ends_with(b"\n") && stream.read(&mut byte).unwrap() == 1 {
        answer.push(byte[0]);
    }
    (stream, String::from_utf8(answer).unwrap())
}

/// The next connection on `fake` (a proxy socket written here), within [`PATIENCE`].
fn next_connection(fake: &StdUnixListener) -> StdUnixStream {
    let deadline = Instant::now() + PATIENCE;
    loop {
        match fake.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false).unwrap();
                stream.set_read_timeout(Some(PATIENCE)).unwrap();
                return stream;
            }
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {
                assert!(Instant::now() < deadline, "nothing connected to the socket");
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(error) => panic!("accept: {error}"),
        }
    }
}

/// Run blocking socket work off the test's runtime.
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(work).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bridge_hands_its_listener_over_and_relays_once_the_proxy_gives_it_back() {
    let directory = tempfile::tempdir().unwrap();
    let socket = directory.path().join("egress.sock");
    let fake = StdUnixListener::bind(&socket).unwrap();
    fake.set_nonblocking(true).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let bridge_task = tokio::spawn(bridge(listener, socket.clone()));

    // The first thing the bridge does: the preface, with its listener.
    let (fake, mut control, said, mut fds) = blocking(move || {
        let control = next_connection(&fake);
        let (said, fds) = receive(&control);
        (fake, control, said, fds)
    })
    .await;
    assert_eq!(said, PREFACE);
    assert_eq!(fds.len(), 1, "one descriptor comes with the preface");
    let handed = std::net::TcpListener::from(fds.pop().unwrap());
    assert_eq!(handed.local_addr().unwrap().port(), port);
    control.write_all(b"OK\n").unwrap();

    // Held by the proxy: a tool's connection arrives on the handed listener,
    // and nothing reaches the socket.
    let handed = TcpListener::from_std(handed).unwrap();
    let mut tool_stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    tool_stream.write_all(b"first").await.unwrap();
    let (mut accepted, _) = tokio::time::timeout(PATIENCE, handed.accept())
        .await
        .expect("the tool's connection did not reach the handed listener")
        .unwrap();
    let mut got = [0; 5];
    accepted.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"first");
    let fake = blocking(move || {
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            fake.accept().is_err(),
            "the bridge relayed a connection while the proxy held its listener"
        );
        fake
    })
    .await;

    // The proxy gives it back (its host ended): the bridge relays again. It
    // offers again too; this proxy declines, and the bridge relays from then on.
    drop((control, handed));
    let mut second = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    second.write_all(b"second").await.unwrap();
    let (fake, relayed, _third) = blocking(move || {
        let mut relayed = Vec::new();
        let mut third = None;
        while relayed.len() < 2 {
            let mut connection = next_connection(&fake);
            let (said, _) = receive(&connection);
            if said == PREFACE {
                connection.write_all(b"NO not in this test\n").unwrap();
            } else {
                relayed.push((said, connection));
            }
            if relayed.len() == 1 && third.is_none() {
                // Past the bridge's next offer, which this proxy declines.
                std::thread::sleep(Duration::from_millis(1500));
                let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
                stream.write_all(b"third").unwrap();
                third = Some(stream);
            }
        }
        (fake, relayed, third)
    })
    .await;
    let said: Vec<&[u8]> = relayed.iter().map(|(said, _)| said.as_slice()).collect();
    assert_eq!(said, [b"second".as_slice(), b"third".as_slice()]);
    let unexpected = blocking(move || {
        std::thread::sleep(Duration::from_millis(300));
        fake.accept().is_ok()
    })
    .await;
    assert!(!unexpected, "the bridge offered again after a decline");
    bridge_task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_takes_only_listening_tcp_sockets_two_at_most_and_judges_their_connections() {
    let upstream = HttpUpstream::start().await;
    let port = upstream.port;
    let mut proxy = Setup::new(&[&format!("{ALLOWED}:{port}")]).start();
    let socket = proxy.socket.clone();
    let listening_one = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listening_one.set_nonblocking(true).unwrap();
    let listening_two = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listening_two.set_nonblocking(true).unwrap();
    let listening_three = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address_two = listening_two.local_addr().unwrap();
    let (answers, first, second) = blocking(move || {
        let (pair, _other) = StdUnixStream::pair().unwrap();
        let connected_to = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let connected = std::net::TcpStream::connect(connected_to.local_addr().unwrap()).unwrap();
        let datagram = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut answers = vec![
            offer(&socket, None).1,
            offer(&socket, Some(pair.as_fd())).1,
            offer(&socket, Some(connected.as_fd())).1,
            offer(&socket, Some(datagram.as_fd())).1,
        ];
        let (first, said) = offer(&socket, Some(listening_one.as_fd()));
        answers.push(said);
        let (second, said) = offer(&socket, Some(listening_two.as_fd()));
        answers.push(said);
        answers.push(offer(&socket, Some(listening_three.as_fd())).1);
        (answers, first, second)
    })
    .await;
    assert_eq!(
        answers,
        [
            "NO no listener came with the handoff\n",
            "NO a Unix socket, not an IP one\n",
            "NO the socket is not listening\n",
            "NO a datagram socket, not a stream one\n",
            "OK\n",
            "OK\n",
            "NO the unit has handed over 2 listeners already\n",
        ]
    );
    assert!(proxy.no_more_events().await, "a handoff is not an attempt");

    // A handed listener's connections are judged as the socket's are.
    let mut client = TcpStream::connect(address_two).await.unwrap();
    client
        .write_all(
            format!("GET http://{ALLOWED}:{port}/handed HTTP/1.1\r\nHost: {ALLOWED}:{port}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
    let (status, _, body) = read_response(&mut client).await;
    assert_eq!((status, body.as_str()), (200, "hello /handed"));
    assert_eq!(
        decision(&proxy.event().await),
        format!("allowed {ALLOWED}:{port}")
    );
    let mut client = TcpStream::connect(address_two).await.unwrap();
    client
        .write_all(b"CONNECT other.test:443 HTTP/1.1\r\nHost: other.test:443\r\n\r\n")
        .await
        .unwrap();
    let (status, _, _) = read_response(&mut client).await;
    assert_eq!(status, 403);
    assert_eq!(decision(&proxy.event().await), "refused not-allowed");

    // A handoff that ends frees its place.
    drop(first);
    let socket = proxy.socket.clone();
    let again = blocking(move || {
        let listening = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let deadline = Instant::now() + PATIENCE;
        loop {
            let (_stream, said) = offer(&socket, Some(listening.as_fd()));
            if said == "OK\n" || Instant::now() > deadline {
                return said;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    })
    .await;
    assert_eq!(again, "OK\n");
    drop(second);
}

/// Whether curl gets through with the proxy's socket moved away: only a proxy
/// that holds the unit's listener answers then. The socket is put back.
async fn served_without_the_socket(socket: &Path, bridge_port: u16, url: &str) -> bool {
    let away = socket.with_extension("away");
    std::fs::rename(socket, &away).unwrap();
    let answer = curl(bridge_port, &[url]).await;
    std::fs::rename(&away, socket).unwrap();
    answer.ends_with(" 200")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_units_connections_reach_the_proxy_on_its_listener_and_the_next_proxy_takes_it_over() {
    if tool("curl").is_none() {
        return;
    }
    let upstream = HttpUpstream::start().await;
    let port = upstream.port;
    let url = format!("http://{ALLOWED}:{port}/handed");
    let directory = tempfile::tempdir().unwrap();
    let socket: PathBuf = directory.path().join("egress.sock");
    let setup = || Setup::new(&[&format!("{ALLOWED}:{port}")]);
    let mut proxy = setup().start_at(socket.clone());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let bridge_port = listener.local_addr().unwrap().port();
    let bridge_task = tokio::spawn(bridge(listener, socket.clone()));

    assert_eq!(curl(bridge_port, &[&url]).await, "hello /handed 200");
    assert!(
        served_without_the_socket(&socket, bridge_port, &url).await,
        "the unit's connection went through the socket, not the handed listener"
    );
    for _ in 0..2 {
        assert_eq!(
            decision(&proxy.event().await),
            format!("allowed {ALLOWED}:{port}")
        );
    }
    let refused = curl(bridge_port, &[&format!("http://other.test:{port}/")]).await;
    assert!(refused.ends_with(" 403"), "{refused}");
    assert_eq!(decision(&proxy.event().await), "refused not-allowed");

    // The host ends; the next one serves the same socket and gets the listener.
    drop(proxy);
    let mut next = setup().start_at(socket.clone());
    let deadline = Instant::now() + PATIENCE;
    while !served_without_the_socket(&socket, bridge_port, &url).await {
        assert!(
            Instant::now() < deadline,
            "the bridge never handed its listener to the next proxy"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        decision(&next.event().await),
        format!("allowed {ALLOWED}:{port}")
    );
    assert_eq!(curl(bridge_port, &[&url]).await, "hello /handed 200");
    bridge_task.abort();
}
