//! This process's stdin and stdout for the protocol, for both ends that speak
//! it over stdio: `box serve`'s stdio transport and the executor.
//!
//! A pipe or a Unix socket (what an MCP client, a backend or `docker exec`
//! hands a process) is read and written non-blocking on the runtime itself:
//! tokio's `Stdin` and `Stdout` do every read and write on the blocking pool,
//! a thread hand-off each way per line that was most of a small call's cost.
//! Terminals and files keep tokio's types.

use std::os::fd::AsFd;

use tokio::io::{AsyncRead, AsyncWrite};

/// This process's stdin and stdout, non-blocking where they are pipes or
/// sockets; the guard puts their file status flags back as found (whoever
/// comes after us in a shell pipeline may share the open pipe).
pub fn stdio() -> (
    Box<dyn AsyncRead + Unpin + Send>,
    Box<dyn AsyncWrite + Unpin + Send>,
    StdioModes,
) {
    let modes = StdioModes {
        _stdin: FileMode::save(std::io::stdin()),
        _stdout: FileMode::save(std::io::stdout()),
    };
    let reader: Box<dyn AsyncRead + Unpin + Send> = match nonblocking(std::io::stdin().as_fd()) {
        Some(Stdio::Pipe(fd)) => match tokio::net::unix::pipe::Receiver::from_owned_fd(fd) {
            Ok(pipe) => Box::new(pipe),
            Err(_) => Box::new(tokio::io::stdin()),
        },
        Some(Stdio::Socket(socket)) => match tokio::net::UnixStream::from_std(socket) {
            Ok(socket) => Box::new(socket),
            Err(_) => Box::new(tokio::io::stdin()),
        },
        None => Box::new(tokio::io::stdin()),
    };
    let writer: Box<dyn AsyncWrite + Unpin + Send> = match nonblocking(std::io::stdout().as_fd()) {
        Some(Stdio::Pipe(fd)) => match tokio::net::unix::pipe::Sender::from_owned_fd(fd) {
            Ok(pipe) => Box::new(pipe),
            Err(_) => Box::new(tokio::io::stdout()),
        },
        Some(Stdio::Socket(socket)) => match tokio::net::UnixStream::from_std(socket) {
            Ok(socket) => Box::new(socket),
            Err(_) => Box::new(tokio::io::stdout()),
        },
        None => Box::new(tokio::io::stdout()),
    };
    (reader, writer, modes)
}

/// stdin's and stdout's file status flags (`O_NONBLOCK`), restored on drop.
pub struct StdioModes {
    _stdin: FileMode<std::io::Stdin>,
    _stdout: FileMode<std::io::Stdout>,
}

/// A file's status flags, restored on drop.
struct FileMode<F: AsFd> {
    file: F,
    flags: Option<nix::fcntl::OFlag>,
}

impl<F: AsFd> FileMode<F> {
    fn save(file: F) -> Self {
        let flags = nix::fcntl::fcntl(file.as_fd(), nix::fcntl::FcntlArg::F_GETFL)
            .ok()
            .map(nix::fcntl::OFlag::from_bits_truncate);
        Self { file, flags }
    }
}

impl<F: AsFd> Drop for FileMode<F> {
    fn drop(&mut self) {
        if let Some(flags) = self.flags {
            let _ = nix::fcntl::fcntl(self.file.as_fd(), nix::fcntl::FcntlArg::F_SETFL(flags));
        }
    }
}

enum Stdio {
    Pipe(std::os::fd::OwnedFd),
    Socket(std::os::unix::net::UnixStream),
}

/// A duplicate of `fd` when it is a pipe or a Unix socket, the socket set
/// non-blocking (tokio's pipe constructors set a pipe so themselves); `None`
/// for anything else, or when duplicating fails.
fn nonblocking(fd: std::os::fd::BorrowedFd<'_>) -> Option<Stdio> {
    use nix::sys::stat::{SFlag, fstat};
    let kind = SFlag::from_bits_truncate(fstat(fd).ok()?.st_mode) & SFlag::S_IFMT;
    let owned = fd.try_clone_to_owned().ok()?;
    if kind == SFlag::S_IFIFO {
        Some(Stdio::Pipe(owned))
    } else if kind == SFlag::S_IFSOCK {
        let socket = std::os::unix::net::UnixStream::from(owned);
        socket.set_nonblocking(true).ok()?;
        Some(Stdio::Socket(socket))
    } else {
        None
    }
}
