//! The listener handoff: a unit's bridge hands its loopback listener to the proxy,
//! which then accepts the unit's connections itself.
//!
//! A relay costs a copy in and a copy out of every byte, and on a small machine
//! the CPU it takes comes out of the tools' own. With the listener handed over,
//! a download crosses one relay (the proxy) instead of two (the proxy, then the
//! bridge over the Unix hop). A socket keeps the network namespace it was made
//! in, so the proxy accepts in the unit's namespace while it connects out in the
//! host's; connections still arrive only from the unit's own loopback.
//!
//! The exchange, on a fresh connection to the unit's proxy socket: the bridge
//! sends [`PREFACE`] with the listener as `SCM_RIGHTS`; the proxy answers
//! [`ACCEPTED`] and keeps the connection open for as long as it accepts on the
//! listener, or answers `NO <reason>` and closes. When that connection ends
//! (the host exited, or handed its sessions on), the bridge accepts again and
//! relays, and offers the listener anew. Nothing here is trusted: any process in
//! the unit can send the preface, with any descriptor, and gains nothing it could
//! not do by connecting to the socket (the connections are judged the same way).

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketType, sockopt,
};
use tokio::io::{AsyncReadExt, Interest};
use tokio::net::{TcpListener, UnixStream};

/// What the bridge sends, with the listener attached.
pub(crate) const PREFACE: &[u8] = b"BOX-EGRESS-LISTENER/1\n";

/// The proxy's answer when it accepts on the listener from now on.
pub(crate) const ACCEPTED: &[u8] = b"OK\n";

/// The proxy's answer when it does not, followed by the reason and a newline.
pub(crate) const DECLINED: &[u8] = b"NO ";

/// Why the bridge keeps relaying.
#[derive(Debug)]
pub(crate) enum Offer {
    /// The proxy socket did not answer, or the exchange broke off: try again later.
    Unreachable(io::Error),
    /// The proxy answered and will not take the listener (a sandbox whose socket
    /// cannot carry descriptors, an older host): do not ask again.
    Declined(String),
}

/// Hand `listener` to the proxy at `socket`. On success, the returned connection
/// stays open for as long as the proxy accepts on the listener; its end of
/// stream means the bridge must accept again.
pub(crate) async fn offer(listener: &TcpListener, socket: &Path) -> Result<UnixStream, Offer> {
    let mut stream = UnixStream::connect(socket)
        .await
        .map_err(Offer::Unreachable)?;
    let fds = [listener.as_fd()];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(Offer::Declined(
            "no room for the listener in the message".to_owned(),
        ));
    }
    let sent = loop {
        stream.writable().await.map_err(Offer::Unreachable)?;
        match stream.try_io(Interest::WRITABLE, || {
            rustix::net::sendmsg(
                &stream,
                &[IoSlice::new(PREFACE)],
                &mut control,
                SendFlags::NOSIGNAL,
            )
            .map_err(io::Error::from)
        }) {
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
            // A sandbox whose socket cannot carry descriptors (gVisor's host-backed
            // sockets) refuses the message; relaying still works there.
            Err(error) => return Err(Offer::Declined(format!("sending the listener: {error}"))),
            Ok(sent) => break sent,
        }
    };
    if sent != PREFACE.len() {
        return Err(Offer::Declined(format!(
            "the socket took {sent} of the preface's {} bytes",
            PREFACE.len()
        )));
    }
    let mut answer = Vec::new();
    let mut byte = [0; 1];
    while !answer.ends_with(b"\n") && answer.len() < 512 {
        match stream.read(&mut byte).await {
            Ok(0) => {
                return Err(Offer::Unreachable(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the proxy closed before answering the listener's handoff",
                )));
            }
            Ok(_) => answer.push(byte[0]),
            Err(error) => return Err(Offer::Unreachable(error)),
        }
    }
    if answer == ACCEPTED {
        return Ok(stream);
    }
    let reason = answer.strip_prefix(DECLINED).unwrap_or(&answer);
    Err(Offer::Declined(
        String::from_utf8_lossy(reason).trim().to_owned(),
    ))
}

/// A connection's first read on the proxy side: up to `buffer.len()` bytes, and
/// the descriptor that came with them, if one did (more than one is refused:
/// every descriptor received is closed unless it is the one returned).
pub(crate) async fn first_read(
    stream: &UnixStream,
    buffer: &mut [u8],
) -> io::Result<(usize, Option<OwnedFd>)> {
    loop {
        stream.readable().await?;
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let received = stream.try_io(Interest::READABLE, || {
            rustix::net::recvmsg(
                stream,
                &mut [IoSliceMut::new(buffer)],
                &mut control,
                RecvFlags::CMSG_CLOEXEC,
            )
            .map_err(io::Error::from)
        });
        match received {
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(error),
            Ok(message) => {
                let mut fds = Vec::new();
                for ancillary in control.drain() {
                    if let RecvAncillaryMessage::ScmRights(received) = ancillary {
                        fds.extend(received);
                    }
                }
                let fd = if fds.len() == 1 { fds.pop() } else { None };
                return Ok((message.bytes, fd));
            }
        }
    }
}

/// The listener a handoff carried, checked to be what the bridge sends: a
/// listening TCP socket. Anything else is refused, naming what it was.
pub(crate) fn listener(fd: OwnedFd) -> Result<TcpListener, String> {
    let domain = sockopt::socket_domain(&fd).map_err(|error| format!("not a socket: {error}"))?;
    if domain == AddressFamily::UNIX {
        return Err("a Unix socket, not an IP one".to_owned());
    }
    if domain != AddressFamily::INET && domain != AddressFamily::INET6 {
        return Err(format!(
            "not an IP socket (address family {})",
            domain.as_raw()
        ));
    }
    let kind = sockopt::socket_type(&fd).map_err(|error| error.to_string())?;
    if kind == SocketType::DGRAM {
        return Err("a datagram socket, not a stream one".to_owned());
    }
    if kind != SocketType::STREAM {
        return Err(format!("not a stream socket (type {})", kind.as_raw()));
    }
    if !sockopt::socket_acceptconn(&fd).map_err(|error| error.to_string())? {
        return Err("the socket is not listening".to_owned());
    }
    let listener = std::net::TcpListener::from(fd);
    // Shared with the bridge's own copy, which is non-blocking already; a
    // hostile sender's blocking socket must not stall the proxy.
    listener
        .set_nonblocking(true)
        .map_err(|error| error.to_string())?;
    TcpListener::from_std(listener).map_err(|error| error.to_string())
}
