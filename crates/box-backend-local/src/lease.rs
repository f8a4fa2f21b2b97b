//! A local unit's lease: the host renews it over a Unix socket, the sandbox
//! helper (outside the unit's confinement: the pid namespace's parent, or the
//! supervisor without one) holds the deadline on `CLOCK_BOOTTIME` and ends
//! the unit when it passes, so a stopped (SIGSTOP), hung or suspended host
//! loses its units within the lease as a docker host does. A dead host's
//! units end at once (parent-death signal).
//!
//! The wire: the host listens on an abstract socket with a random name, given
//! to the helper in its spec (over its private stdin); the helper connects
//! before it enters any namespace, and the host accepts only a connection
//! whose peer is the helper's pid. A renewal is one byte from the host; the
//! host closing its end stops renewals (the unit then ends within its lease).
//! The helper writes [`LAPSED`] back before it ends a unit for a lapse, so
//! the host can tell that end from an executor's own exit code.

use std::time::Duration;

/// The byte the helper sends when it ended the unit for a lapsed lease.
pub(crate) const LAPSED: u8 = b'L';

/// The byte the host sends to renew.
pub(crate) const RENEW: u8 = b'r';

/// The helper's exit code when the lease lapsed (as box's init's).
pub(crate) const EXIT_LEASE_LAPSED: u8 = 75;

/// `CLOCK_BOOTTIME` now: it keeps counting while the machine is suspended.
pub(crate) fn boottime_now() -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into a local timespec.
    let result = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut now) };
    if result != 0 {
        return Duration::ZERO;
    }
    Duration::new(
        u64::try_from(now.tv_sec).unwrap_or(0),
        u32::try_from(now.tv_nsec).unwrap_or(0),
    )
}

/// The helper's side.
pub(crate) mod helper {
    use std::os::fd::{AsRawFd, OwnedFd, RawFd};
    use std::os::linux::net::SocketAddrExt as _;
    use std::os::unix::net::{SocketAddr, UnixStream};
    use std::time::Duration;

    use super::{LAPSED, boottime_now};
    use crate::helper::SpecLease;

    /// The lease as the helper holds it.
    #[derive(Debug)]
    pub(crate) struct LeaseWatch {
        /// The connection to the host; `None` once it failed.
        connection: Option<OwnedFd>,
        /// The host closed its end (it let the unit go): no more renewals,
        /// but the connection stays open for the lapse's report, which the
        /// host still reads.
        renewals_ended: bool,
        ttl: Duration,
        deadline: Duration,
    }

    /// What ended a wait.
    #[derive(Debug, PartialEq, Eq)]
    pub(crate) enum Woken {
        /// The watched fd is readable (or hung up).
        Ready,
        /// The lease lapsed.
        Lapsed,
    }

    impl LeaseWatch {
        /// Connect to the host's socket; the lease runs from now.
        pub(crate) fn connect(spec: &SpecLease) -> Result<Self, String> {
            let address = SocketAddr::from_abstract_name(spec.socket.as_bytes())
                .map_err(|error| format!("the lease socket's name: {error}"))?;
            let stream = UnixStream::connect_addr(&address)
                .map_err(|error| format!("connecting to the host's lease socket: {error}"))?;
            let ttl = Duration::from_millis(spec.ttl_ms);
            Ok(Self {
                connection: Some(OwnedFd::from(stream)),
                renewals_ended: false,
                ttl,
                deadline: boottime_now() + ttl,
            })
        }

        /// The lease's length.
        pub(crate) fn ttl(&self) -> Duration {
            self.ttl
        }

        /// Wait until `fd` is readable, taking renewals meanwhile, or until
        /// the lease lapses.
        pub(crate) fn wait(&mut self, fd: RawFd) -> Woken {
            let mut buffer = [0u8; 64];
            loop {
                let now = boottime_now();
                if now >= self.deadline {
                    return Woken::Lapsed;
                }
                let left = self.deadline - now;
                // Rounded up, so a wake never comes before the deadline.
                let timeout = i32::try_from(left.as_millis() + 1).unwrap_or(i32::MAX);
                let mut fds = [
                    libc::pollfd {
                        fd,
                        events: libc::POLLIN,
                        revents: 0,
                    },
                    libc::pollfd {
                        fd: match &self.connection {
                            Some(connection) if !self.renewals_ended => connection.as_raw_fd(),
                            _ => -1,
                        },
                        events: libc::POLLIN,
                        revents: 0,
                    },
                ];
                // SAFETY: poll on a local array of two pollfds (a negative fd
                // is ignored by the kernel).
                let ready = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout) };
                if ready < 0 {
                    // EINTR (a signal the helper does not block): look again.
                    continue;
                }
                if fds[0].revents != 0 {
                    return Woken::Ready;
                }
                if fds[1].revents != 0 {
                    let Some(connection) = self.connection.as_ref() else {
                        continue;
                    };
                    // SAFETY: read into a local buffer of its length.
                    let read = unsafe {
                        libc::read(
                            connection.as_raw_fd(),
                            buffer.as_mut_ptr().cast(),
                            buffer.len(),
                        )
                    };
                    if read > 0 {
                        self.deadline = boottime_now() + self.ttl;
                    } else if read == 0 {
                        // The host let the unit go: no more renewals, the
                        // deadline stands.
                        self.renewals_ended = true;
                    } else if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                        self.connection = None;
                    }
                }
            }
        }

        /// Tell the host the unit ended for a lapse (it may be stopped: the
        /// byte waits in the socket).
        pub(crate) fn report_lapse(&self) {
            if let Some(connection) = &self.connection {
                // SAFETY: send of one byte from a local; MSG_NOSIGNAL, so a
                // closed peer is an error, never SIGPIPE.
                unsafe {
                    libc::send(
                        connection.as_raw_fd(),
                        std::ptr::from_ref(&LAPSED).cast(),
                        1,
                        libc::MSG_NOSIGNAL,
                    )
                };
            }
        }
    }
}

/// The host's side.
pub(crate) mod host {
    use std::os::linux::net::SocketAddrExt as _;
    use std::os::unix::net::SocketAddr;
    use std::time::Duration;

    use box_backend::Renewal;
    use tokio::io::AsyncWriteExt as _;
    use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
    use tokio::net::{UnixListener, UnixStream};

    use super::{LAPSED, RENEW};

    /// The host's listening socket for one unit's helper.
    pub(crate) struct LeaseSocket {
        listener: UnixListener,
        name: String,
    }

    impl LeaseSocket {
        /// Listen on a fresh random abstract name.
        pub(crate) fn bind() -> std::io::Result<Self> {
            let name = format!("box-lease-{:032x}", rand::random::<u128>());
            let address = SocketAddr::from_abstract_name(name.as_bytes())?;
            let listener = std::os::unix::net::UnixListener::bind_addr(&address)?;
            listener.set_nonblocking(true)?;
            Ok(Self {
                listener: UnixListener::from_std(listener)?,
                name,
            })
        }

        /// The name the helper connects to.
        pub(crate) fn name(&self) -> &str {
            &self.name
        }

        /// The helper's connection (peer pid `helper`); others are dropped.
        /// The helper connects before it reports, so after its report this
        /// answers at once.
        pub(crate) async fn accept(
            self,
            helper: u32,
            timeout: Duration,
        ) -> Result<UnixStream, String> {
            let wait = async {
                loop {
                    let (stream, _) =
                        self.listener.accept().await.map_err(|error| {
                            format!("accepting the helper's connection: {error}")
                        })?;
                    let peer = stream.peer_cred().ok().and_then(|cred| cred.pid());
                    if peer.and_then(|pid| u32::try_from(pid).ok()) == Some(helper) {
                        return Ok(stream);
                    }
                    tracing::warn!(
                        ?peer,
                        helper,
                        "refused a connection to a unit's lease socket: not its helper"
                    );
                }
            };
            tokio::time::timeout(timeout, wait).await.map_err(|_| {
                format!("the sandbox helper did not connect to its lease socket within {timeout:?}")
            })?
        }
    }

    /// Renew every third of `ttl` until a write fails or the returned
    /// [`Renewal`] is dropped (which closes the host's end: the helper then
    /// ends the unit when the lease runs out).
    pub(crate) fn renew(mut writer: OwnedWriteHalf, ttl: Duration) -> Renewal {
        let task = tokio::spawn(async move {
            let interval = ttl / 3;
            loop {
                tokio::time::sleep(interval).await;
                if writer.write_all(&[RENEW]).await.is_err() {
                    return;
                }
            }
        });
        Renewal::new(task.abort_handle())
    }

    /// Whether the helper, now ended, said it ended the unit for a lapse: it
    /// writes the byte before it exits, so after its exit the byte is there.
    pub(crate) fn lapsed(reader: &OwnedReadHalf) -> bool {
        let mut byte = [0u8; 1];
        matches!(reader.try_read(&mut byte), Ok(1) if byte[0] == LAPSED)
    }
}
