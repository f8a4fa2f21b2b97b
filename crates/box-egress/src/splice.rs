//! Tunnel bytes moved by the kernel: socket → pipe → socket with `splice(2)`.
//!
//! A tunnel with no bandwidth cap has nothing to look at in its bytes once the
//! first flight was judged, so user space need not copy them: `splice` hands the
//! receiving socket's pages to a pipe and the pipe's pages to the sending socket.
//! A TCP socket's received pages go to the pipe without a copy, so the
//! tunnels that read from TCP into a Unix socket splice: the proxy's download
//! from upstream to a bridge that relays, and the bridge's upload from a unit's
//! tool. Reading from a Unix socket copies anyway, and TCP to TCP (a tunnel on a
//! listener the unit handed over) measured slower spliced than copied, so those
//! keep the buffered copy.
//! A capped tunnel keeps the buffered copy (`http::pump`): the token bucket meters
//! what it writes.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use nix::fcntl::{FcntlArg, OFlag, SpliceFFlags, fcntl, splice};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, Interest};
use tokio::net::{TcpStream, UnixStream};

use crate::http;
use crate::limit::TokenBucket;

/// The most moved by one `splice` call, and the pipe's size asked for (the
/// default is 64 KiB; a larger pipe halves the calls of a bulk download, and a
/// host whose `fs.pipe-max-size` refuses it keeps the default).
const CHUNK: usize = 1024 * 1024;

/// The send buffer asked for on the Unix socket between a unit's bridge and
/// its proxy (the kernel caps it at `net.core.wmem_max`).
const UNIX_SEND_BUFFER: usize = 4 << 20;

/// Let the Unix hop between bridge and proxy hold a few MiB in flight: with
/// the default (about 200 KiB) the sender stalls until the other side is
/// scheduled, and a download through a unit left a core idle.
pub(crate) fn widen_send_buffer(stream: &UnixStream) {
    if let Err(error) =
        nix::sys::socket::setsockopt(stream, nix::sys::socket::sockopt::SndBuf, &UNIX_SEND_BUFFER)
    {
        tracing::debug!(%error, "widening the egress socket's send buffer");
    }
}

/// One end of a tunnel: a socket tokio polls.
#[derive(Clone, Copy)]
pub(crate) enum Socket<'a> {
    Tcp(&'a TcpStream),
    Unix(&'a UnixStream),
}

impl<'a> From<&'a TcpStream> for Socket<'a> {
    fn from(stream: &'a TcpStream) -> Self {
        Self::Tcp(stream)
    }
}

impl<'a> From<&'a UnixStream> for Socket<'a> {
    fn from(stream: &'a UnixStream) -> Self {
        Self::Unix(stream)
    }
}

impl Socket<'_> {
    fn fd(&self) -> BorrowedFd<'_> {
        match self {
            Self::Tcp(stream) => stream.as_fd(),
            Self::Unix(stream) => stream.as_fd(),
        }
    }

    async fn ready(&self, interest: Interest) -> io::Result<()> {
        match self {
            Self::Tcp(stream) => stream.ready(interest).await.map(drop),
            Self::Unix(stream) => stream.ready(interest).await.map(drop),
        }
    }

    /// `call` on the socket, clearing its readiness when it would block.
    fn try_io<R>(&self, interest: Interest, call: impl FnOnce() -> io::Result<R>) -> io::Result<R> {
        match self {
            Self::Tcp(stream) => stream.try_io(interest, call),
            Self::Unix(stream) => stream.try_io(interest, call),
        }
    }

    /// `splice` between this socket and a pipe end, once it is ready for `interest`.
    async fn splice(
        &self,
        interest: Interest,
        from: BorrowedFd<'_>,
        to: BorrowedFd<'_>,
        most: usize,
    ) -> io::Result<usize> {
        let flags = SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK;
        loop {
            self.ready(interest).await?;
            match self.try_io(interest, || {
                splice(from, None, to, None, most, flags).map_err(io::Error::from)
            }) {
                Ok(moved) => return Ok(moved),
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(error),
            }
        }
    }
}

/// A pipe to splice through: (read end, write end).
pub(crate) struct Pipe(OwnedFd, OwnedFd);

impl Pipe {
    /// A non-blocking pipe, as large as the host lets it be (up to [`CHUNK`]).
    pub(crate) fn new() -> io::Result<Self> {
        let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)?;
        let size = i32::try_from(CHUNK).unwrap_or(i32::MAX);
        // Refused above `fs.pipe-max-size` for an unprivileged process: the
        // default size still works, with more calls.
        let _ = fcntl(&write, FcntlArg::F_SETPIPE_SZ(size));
        Ok(Self(read, write))
    }
}

/// A tunnel's half that can name its socket.
pub(crate) trait Spliceable {
    fn socket(&self) -> Socket<'_>;
}

macro_rules! spliceable {
    ($($half:ty),*) => {$(
        impl Spliceable for $half {
            fn socket(&self) -> Socket<'_> {
                Socket::from(self.as_ref())
            }
        }
    )*};
}

spliceable!(
    tokio::net::tcp::OwnedReadHalf,
    tokio::net::tcp::OwnedWriteHalf,
    tokio::net::unix::OwnedReadHalf,
    tokio::net::unix::OwnedWriteHalf
);

/// Copy `reader` to `writer` until end of stream, then shut the writer's side
/// down: spliced from a TCP socket into a Unix one when no `bucket` caps the rate;
/// otherwise (or should a pipe not be had) through a buffer.
pub(crate) async fn relay<R, W>(
    reader: &mut R,
    writer: &mut W,
    bucket: Option<&TokenBucket>,
    sent: &mut u64,
) -> io::Result<()>
where
    R: AsyncRead + Spliceable + Unpin,
    W: AsyncWrite + Spliceable + Unpin,
{
    // A Unix socket's bytes are copied into the pipe anyway (its buffers are
    // not pages the pipe can take), so splicing from one only adds calls: in
    // the bench the bridge's download spent more CPU per GiB spliced than copied.
    // Into TCP, spliced pages reach the reader as many small fragments: a
    // download relayed TCP to TCP on loopback ran at 0.6–0.9 of a copying relay.
    let tcp_to_unix = matches!(
        (reader.socket(), writer.socket()),
        (Socket::Tcp(_), Socket::Unix(_))
    );
    let pipe = match bucket {
        Some(_) => None,
        None if !tcp_to_unix => None,
        None => Pipe::new()
            .inspect_err(|error| tracing::debug!(%error, "no pipe to splice through; copying"))
            .ok(),
    };
    let Some(pipe) = pipe else {
        return http::pump(reader, writer, bucket, sent).await;
    };
    pump(reader.socket(), writer.socket(), &pipe, sent).await?;
    writer.shutdown().await
}

/// Move everything `from` receives to `to` until `from`'s end of stream,
/// counting the bytes into `sent`; the caller shuts `to`'s writing side down.
/// `sent` counts what reached `to`, as the copying pump does.
pub(crate) async fn pump(
    from: Socket<'_>,
    to: Socket<'_>,
    pipe: &Pipe,
    sent: &mut u64,
) -> io::Result<()> {
    let Pipe(pipe_read, pipe_write) = pipe;
    loop {
        // The pipe is empty here: a would-block can only be the socket's.
        let moved = from
            .splice(Interest::READABLE, from.fd(), pipe_write.as_fd(), CHUNK)
            .await?;
        if moved == 0 {
            return Ok(());
        }
        let mut left = moved;
        while left > 0 {
            let written = to
                .splice(Interest::WRITABLE, pipe_read.as_fd(), to.fd(), left)
                .await?;
            if written == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    "the receiving socket took no bytes",
                ));
            }
            left -= written;
            *sent += written as u64;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;

    /// Bytes from a TCP peer reach a Unix peer whole and in order, the count is
    /// right, and the end of stream ends the pump.
    #[tokio::test]
    async fn a_tcp_stream_is_spliced_into_a_unix_stream_whole() -> io::Result<()> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let payload: Vec<u8> = (0..3_000_000u32).map(|n| (n % 251) as u8).collect();
        let sending = payload.clone();
        let sender = tokio::spawn(async move {
            let mut stream = TcpStream::connect(address).await?;
            stream.write_all(&sending).await?;
            stream.shutdown().await
        });
        let (tcp, _) = listener.accept().await?;
        let (unix_in, mut unix_out) = UnixStream::pair()?;
        let receiver = tokio::spawn(async move {
            let mut got = Vec::new();
            unix_out.read_to_end(&mut got).await.map(|_| got)
        });
        let pipe = Pipe::new()?;
        let mut sent = 0;
        pump(Socket::from(&tcp), Socket::from(&unix_in), &pipe, &mut sent).await?;
        drop(unix_in);
        sender.await.map_err(io::Error::other)??;
        let got = receiver.await.map_err(io::Error::other)??;
        assert_eq!(sent, payload.len() as u64);
        assert!(got == payload, "the bytes arrived changed or out of order");
        Ok(())
    }
}
