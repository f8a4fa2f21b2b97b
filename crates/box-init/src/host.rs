//! The host's end: listen on a unit's run directory, authenticate its init,
//! and use the connection as the executor's stdio plus a lease.
//!
//! ```text
//! let listener = host::bind(&run_dir)?;                 // before the unit starts
//! let channel = listener.accept(&key, unit, timeout).await?;
//! // channel.reader / channel.writer: the executor's stdout / stdin (MCP lines)
//! // channel.lease.renew(ttl, epoch) every ttl / 3; channel.ended: the exit report
//! ```
//!
//! Reattach is the same two calls from a new host process: [`bind`] unlinks the
//! dead host's socket and listens afresh on the same path, the init (which
//! retries every 250 ms to 1 s while its lease runs) connects, and [`accept`]
//! checks it with the persisted key. Accepting never renews: the host renews
//! explicitly, first with an epoch above [`InitState::epoch`] when it takes
//! over from another live process.
//!
//! [`accept`]: UnitListener::accept

use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncBufRead, AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::UnixListener;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::PollSender;

use crate::handshake::{self, Established, HandshakeError};
use crate::line::{LineEvent, LineReader};
use crate::protocol::{
    self, CONTROL_PREFIX, EndReport, HostMessage, InitMessage, InitState, MAX_LINE_BYTES,
    SOCKET_NAME, UnitKey,
};

/// How long one connection may take over its handshake before it is dropped
/// (the real init answers within milliseconds).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// Handshakes in progress at once; more connections wait in the backlog, so a
/// flood of impostors costs bounded memory and cannot starve the real init
/// for longer than one handshake timeout.
const CONCURRENT_HANDSHAKES: usize = 16;

/// Lines queued toward the init (MCP and control, in order).
const OUTGOING_LINES: usize = 64;

/// Lines from the executor waiting for the host's reader.
const INCOMING_LINES: usize = 64;

/// The longest Unix socket path (`sun_path` less its terminating NUL).
const MAX_SOCKET_PATH: usize = 107;

/// What went wrong on the host's end.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The socket path does not fit in a `sockaddr_un`.
    #[error(
        "unit socket path {path} is {length} bytes, longer than the {MAX_SOCKET_PATH} a Unix socket allows: use a shorter run directory"
    )]
    PathTooLong {
        /// The socket path.
        path: PathBuf,
        /// Its length.
        length: usize,
    },
    /// Something other than a socket is where the socket goes.
    #[error("{path} exists and is not a socket; refusing to replace it")]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// Binding, unlinking or setting the mode failed.
    #[error("cannot listen on {path}: {source}")]
    Bind {
        /// The socket path.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// No authenticated init connected in time.
    #[error("unit {unit}: no authenticated init connected to {path} within {timeout:?}")]
    AcceptTimeout {
        /// The unit.
        unit: String,
        /// The socket path.
        path: PathBuf,
        /// How long the host waited.
        timeout: Duration,
    },
}

/// A lease renewal that did not take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseError {
    /// The init has accepted a higher epoch: another host has taken over.
    #[error("lease renewal at epoch {epoch} refused: epoch {current} has taken over this unit")]
    Fenced {
        /// The epoch this host renewed with.
        epoch: u64,
        /// The highest epoch the init accepted.
        current: u64,
    },
    /// No answer within the wait.
    #[error("the unit's init did not answer a lease renewal within {0:?}")]
    Unanswered(Duration),
    /// The channel ended (the unit ended, or the connection dropped).
    #[error("the unit's channel has ended: {0}")]
    Ended(UnitEnd),
}

/// How a unit's channel ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnitEnd {
    /// The init sent its exit report: the unit is ending.
    Reported(EndReport),
    /// The host released the unit and the init confirmed it.
    Released,
    /// The connection dropped without a report (the init was killed, the
    /// unit removed, or the connection broke): the init, if alive, is
    /// reconnecting.
    Disconnected,
}

impl std::fmt::Display for UnitEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UnitEnd::Reported(report) => write!(
                f,
                "the unit ended ({}, init exit code {})",
                report.reason, report.exit_code
            ),
            UnitEnd::Released => f.write_str("the unit was released to another host"),
            UnitEnd::Disconnected => f.write_str("the connection to the unit's init dropped"),
        }
    }
}

/// Listens on a unit's run directory for its init.
#[derive(Debug)]
pub struct UnitListener {
    listener: UnixListener,
    path: PathBuf,
}

/// Listens on `run_dir/host.sock`, replacing a stale socket left by a dead
/// host. The socket is made connectable by any uid (mode 0666): the unit's
/// user may differ from the host's, and the proof, not the mode, is what
/// admits an init; who can reach the socket on the host is the run
/// directory's mode, which the caller sets.
///
/// Dropping the listener does not unlink the socket: in a handover the path
/// already belongs to the next host.
pub fn bind(run_dir: &Path) -> Result<UnitListener, HostError> {
    let path = run_dir.join(SOCKET_NAME);
    let length = path.as_os_str().len();
    if length > MAX_SOCKET_PATH {
        return Err(HostError::PathTooLong { path, length });
    }
    let bind_error = |path: &Path, source| HostError::Bind {
        path: path.to_owned(),
        source,
    };
    match std::fs::symlink_metadata(&path) {
        Ok(metadata) if metadata.file_type().is_socket() => {
            std::fs::remove_file(&path).map_err(|source| bind_error(&path, source))?;
        }
        Ok(_) => return Err(HostError::NotASocket { path }),
        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
        Err(source) => return Err(bind_error(&path, source)),
    }
    let listener = UnixListener::bind(&path).map_err(|source| bind_error(&path, source))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))
        .map_err(|source| bind_error(&path, source))?;
    Ok(UnitListener { listener, path })
}

impl UnitListener {
    /// The socket's path on the host.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Waits up to `timeout` for the unit's init to connect and prove it holds
    /// `key` for `unit`. A connection that fails (an impostor in the unit, a
    /// stale peer) is logged and dropped while the listener keeps accepting,
    /// so the real init still gets in. May be called again on the same
    /// listener after the channel drops.
    pub async fn accept(
        &self,
        key: &UnitKey,
        unit: &str,
        timeout: Duration,
    ) -> Result<UnitChannel, HostError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut handshakes = JoinSet::new();
        loop {
            tokio::select! {
                accepted = self.listener.accept(), if handshakes.len() < CONCURRENT_HANDSHAKES => match accepted {
                    Ok((stream, _)) => {
                        let key = key.clone();
                        let unit = unit.to_owned();
                        handshakes.spawn(async move {
                            match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake::host_side(stream, &key, &unit)).await {
                                Ok(result) => result.map_err(Refusal::Handshake),
                                Err(_) => Err(Refusal::Timeout),
                            }
                        });
                    }
                    Err(error) => {
                        // EMFILE and friends: back off rather than spin.
                        tracing::warn!(unit, path = %self.path.display(), %error, "accept on the unit's socket failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                Some(joined) = handshakes.join_next() => match joined {
                    Ok(Ok((established, state))) => return Ok(UnitChannel::start(established, state)),
                    Ok(Err(Refusal::Handshake(HandshakeError::Closed))) => {
                        // An init that gave up waiting in the backlog, or a
                        // peer that left: nothing was claimed.
                        tracing::debug!(unit, path = %self.path.display(), "a connection to the unit's socket hung up before the handshake ended");
                    }
                    Ok(Err(refusal)) => {
                        tracing::warn!(unit, path = %self.path.display(), %refusal, "refused a connection to the unit's host socket");
                    }
                    Err(error) => tracing::warn!(unit, %error, "a handshake task failed"),
                },
                () = tokio::time::sleep_until(deadline) => {
                    return Err(HostError::AcceptTimeout { unit: unit.to_owned(), path: self.path.clone(), timeout });
                }
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum Refusal {
    #[error("{0}")]
    Handshake(HandshakeError),
    #[error("no handshake within {HANDSHAKE_TIMEOUT:?}")]
    Timeout,
}

/// An authenticated connection to a unit's init.
#[derive(Debug)]
pub struct UnitChannel {
    /// The executor's stdout: MCP lines, control lines removed. Ends after the
    /// init's exit report, a confirmed release, or a dropped connection.
    pub reader: McpReader,
    /// The executor's stdin: write whole MCP lines; shutting it down closes
    /// the executor's stdin after the lines already written.
    pub writer: McpWriter,
    /// The unit's lease.
    pub lease: Lease,
    /// How the channel ended, once it has.
    pub ended: Ended,
    /// Where the unit stood when it connected (lease left, epoch, executor).
    pub state: InitState,
}

impl UnitChannel {
    fn start(established: Established, state: InitState) -> Self {
        let Established { reader, writer } = established;
        let (outgoing, outgoing_queue) = mpsc::channel(OUTGOING_LINES);
        let (lines, incoming) = mpsc::channel(INCOMING_LINES);
        let (answers, answers_seen) = watch::channel(Answers::default());
        let (end, ended) = watch::channel(None);
        tokio::spawn(write_to_init(writer, outgoing_queue));
        tokio::spawn(read_from_init(reader, lines, answers, end));
        UnitChannel {
            reader: McpReader {
                lines: incoming,
                current: Vec::new(),
                position: 0,
            },
            writer: McpWriter {
                queue: PollSender::new(outgoing.clone()),
                pending: Vec::new(),
            },
            lease: Lease {
                queue: outgoing,
                answers: answers_seen,
                ended: ended.clone(),
            },
            ended: Ended(ended),
            state,
        }
    }
}

/// Writes queued lines to the init, one write each, until the queue closes
/// or a release has been written.
async fn write_to_init(mut writer: OwnedWriteHalf, mut queue: mpsc::Receiver<Vec<u8>>) {
    let release = protocol::encode_control(&HostMessage::Release {});
    while let Some(line) = queue.recv().await {
        if let Err(error) = writer.write_all(&line).await {
            tracing::debug!(%error, "writing to the unit's init failed");
            break;
        }
        if line == release {
            // Nothing may follow a release on this connection.
            break;
        }
    }
    queue.close();
}

/// Reads the init's lines: MCP lines to the reader, control lines dispatched.
async fn read_from_init(
    mut reader: LineReader<OwnedReadHalf>,
    lines: mpsc::Sender<Vec<u8>>,
    answers: watch::Sender<Answers>,
    end: watch::Sender<Option<UnitEnd>>,
) {
    let answer = |latest: LeaseAnswer| {
        answers.send_modify(|answers| {
            answers.count += 1;
            answers.latest = Some(latest);
        });
    };
    let outcome = loop {
        match reader.next_line().await {
            Ok(LineEvent::Line) => {
                let line = reader.line();
                if protocol::is_control(line) {
                    match protocol::parse_control::<InitMessage>(line) {
                        Ok(InitMessage::Renewed {
                            epoch,
                            remaining_ms,
                        }) => answer(LeaseAnswer::Renewed {
                            epoch,
                            remaining: Duration::from_millis(remaining_ms),
                        }),
                        Ok(InitMessage::Rejected { epoch, current }) => {
                            answer(LeaseAnswer::Rejected { epoch, current })
                        }
                        Ok(InitMessage::Released {}) => break UnitEnd::Released,
                        Ok(InitMessage::Ended(report)) => break UnitEnd::Reported(report),
                        Ok(other) => {
                            let message = crate::protocol::kind_of(&other);
                            tracing::warn!(%message, "unexpected control message from a unit's init")
                        }
                        Err(error) => {
                            tracing::warn!(%error, "unreadable control line from a unit's init")
                        }
                    }
                } else if lines.send(line.to_vec()).await.is_err() {
                    // Nobody reads the executor's output any more; keep
                    // reading for the control lines.
                }
                reader.consume();
            }
            Ok(LineEvent::TooLong { bytes }) => {
                tracing::warn!(
                    bytes,
                    limit = MAX_LINE_BYTES,
                    "dropped an over-long line from a unit"
                );
            }
            Ok(LineEvent::End { .. }) => break UnitEnd::Disconnected,
            Err(error) => {
                tracing::debug!(%error, "reading from the unit's init failed");
                break UnitEnd::Disconnected;
            }
        }
    };
    drop(lines);
    end.send_replace(Some(outcome));
}

/// The init's latest answer to a renewal on this connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseAnswer {
    /// Renewed at `epoch`, with `remaining` left.
    Renewed {
        /// The renewal's epoch.
        epoch: u64,
        /// Time left, as the init counted it.
        remaining: Duration,
    },
    /// Refused: `current` is higher than `epoch`.
    Rejected {
        /// The renewal's epoch.
        epoch: u64,
        /// The highest epoch the init accepted.
        current: u64,
    },
}

/// The answers seen so far: how many, and the latest.
#[derive(Debug, Clone, Copy, Default)]
struct Answers {
    count: u64,
    latest: Option<LeaseAnswer>,
}

/// The unit's lease, as the host holds it.
///
/// Renewing is sending: [`renew`](Self::renew) returns once the renewal is
/// queued, so a renewal loop keeps its cadence whatever happens to the
/// answers, which travel behind the executor's output and wait when the
/// host's reader is not being read. [`renew_confirmed`](Self::renew_confirmed)
/// also waits for the answer, for the moments that need it (taking over a
/// unit from another host).
#[derive(Debug)]
pub struct Lease {
    queue: mpsc::Sender<Vec<u8>>,
    answers: watch::Receiver<Answers>,
    ended: watch::Receiver<Option<UnitEnd>>,
}

impl Lease {
    /// How often to renew a lease of `ttl`: a third of it, so two renewals
    /// can go missing before it lapses.
    pub fn renew_interval(ttl: Duration) -> Duration {
        ttl / 3
    }

    /// Sends a renewal: the lease becomes `ttl` from when the init reads it,
    /// at `epoch`. Fails when the channel has ended, or when the init has
    /// already refused this epoch (another host took over: stop renewing).
    pub async fn renew(&self, ttl: Duration, epoch: u64) -> Result<(), LeaseError> {
        if let Some(LeaseAnswer::Rejected {
            epoch: refused,
            current,
        }) = self.latest()
            && refused >= epoch
        {
            return Err(LeaseError::Fenced { epoch, current });
        }
        let line = protocol::encode_control(&HostMessage::Lease {
            ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
            epoch,
        });
        self.send(line).await
    }

    /// Sends a renewal and waits up to `wait` for the init's answer; returns
    /// the time left it reports.
    pub async fn renew_confirmed(
        &self,
        ttl: Duration,
        epoch: u64,
        wait: Duration,
    ) -> Result<Duration, LeaseError> {
        let mut answers = self.answers.clone();
        let seen = answers.borrow_and_update().count;
        self.renew(ttl, epoch).await?;
        let answered = tokio::time::timeout(wait, async {
            loop {
                tokio::select! {
                    changed = answers.changed() => {
                        if changed.is_err() {
                            return Err(self.end_error().await);
                        }
                        let current = *answers.borrow_and_update();
                        match current.latest {
                            _ if current.count <= seen => {}
                            Some(LeaseAnswer::Renewed { epoch: answered, remaining }) if answered == epoch => return Ok(remaining),
                            Some(LeaseAnswer::Rejected { epoch: answered, current }) if answered == epoch => {
                                return Err(LeaseError::Fenced { epoch, current });
                            }
                            _ => {}
                        }
                    }
                    end = wait_for_end(self.ended.clone()) => return Err(LeaseError::Ended(end)),
                }
            }
        })
        .await;
        answered.unwrap_or(Err(LeaseError::Unanswered(wait)))
    }

    /// The init's latest answer to a renewal on this connection.
    pub fn latest(&self) -> Option<LeaseAnswer> {
        self.answers.borrow().latest
    }

    /// Detaches from the unit on purpose (handing it to another host): the
    /// init confirms after the last whole line it sends on this connection,
    /// which the [`McpReader`] yields before its end. The lease keeps running
    /// in the unit; the next host must connect and renew before it lapses.
    /// Keep reading the `McpReader` until it ends, or the confirmation cannot
    /// arrive.
    pub async fn release(self) -> Result<(), LeaseError> {
        self.send(protocol::encode_control(&HostMessage::Release {}))
            .await?;
        match wait_for_end(self.ended.clone()).await {
            UnitEnd::Released => Ok(()),
            other => Err(LeaseError::Ended(other)),
        }
    }

    async fn send(&self, line: Vec<u8>) -> Result<(), LeaseError> {
        match self.queue.send(line).await {
            Ok(()) => Ok(()),
            Err(_) => Err(self.end_error().await),
        }
    }

    async fn end_error(&self) -> LeaseError {
        LeaseError::Ended(wait_for_end(self.ended.clone()).await)
    }
}

async fn wait_for_end(mut ended: watch::Receiver<Option<UnitEnd>>) -> UnitEnd {
    match ended.wait_for(Option::is_some).await {
        Ok(end) => end.clone().unwrap_or(UnitEnd::Disconnected),
        Err(_) => UnitEnd::Disconnected,
    }
}

/// How the channel ended; clone it to wait in several places.
#[derive(Debug, Clone)]
pub struct Ended(watch::Receiver<Option<UnitEnd>>);

impl Ended {
    /// Waits until the channel has ended.
    pub async fn wait(&self) -> UnitEnd {
        wait_for_end(self.0.clone()).await
    }

    /// How the channel ended, if it has.
    pub fn now(&self) -> Option<UnitEnd> {
        self.0.borrow().clone()
    }
}

/// The executor's stdout as the host reads it: MCP lines only, each whole.
#[derive(Debug)]
pub struct McpReader {
    lines: mpsc::Receiver<Vec<u8>>,
    current: Vec<u8>,
    position: usize,
}

impl AsyncRead for McpReader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let available = ready!(poll_available(this, cx));
        let count = available.len().min(buf.remaining());
        buf.put_slice(&available[..count]);
        this.position += count;
        Poll::Ready(Ok(()))
    }
}

impl AsyncBufRead for McpReader {
    fn poll_fill_buf(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<&[u8]>> {
        let this = self.get_mut();
        ready!(poll_available(this, cx));
        Poll::Ready(Ok(&this.current[this.position..]))
    }

    fn consume(self: Pin<&mut Self>, amount: usize) {
        let this = self.get_mut();
        this.position = (this.position + amount).min(this.current.len());
    }
}

/// Makes `current[position..]` non-empty, or leaves it empty at the end.
fn poll_available<'a>(reader: &'a mut McpReader, cx: &mut Context<'_>) -> Poll<&'a [u8]> {
    while reader.position == reader.current.len() {
        match ready!(reader.lines.poll_recv(cx)) {
            Some(line) => {
                reader.current = line;
                reader.position = 0;
            }
            None => break,
        }
    }
    Poll::Ready(&reader.current[reader.position..])
}

/// The executor's stdin as the host writes it. Lines are queued whole: bytes
/// reach the init only once their newline has been written, so a host that
/// dies mid-line never sends half of one. A line may not start with `!`
/// (that is the control prefix; MCP lines start with `{`).
#[derive(Debug)]
pub struct McpWriter {
    queue: PollSender<Vec<u8>>,
    pending: Vec<u8>,
}

impl AsyncWrite for McpWriter {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        if this.pending.is_empty() && buf[0] == CONTROL_PREFIX {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "an MCP line to a unit cannot start with `!` (the control prefix)",
            )));
        }
        let Some(newline) = buf.iter().position(|&byte| byte == b'\n') else {
            if this.pending.len() + buf.len() > MAX_LINE_BYTES {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("a line to a unit is longer than {MAX_LINE_BYTES} bytes"),
                )));
            }
            this.pending.extend_from_slice(buf);
            return Poll::Ready(Ok(buf.len()));
        };
        ready!(this.queue.poll_reserve(cx)).map_err(|_| closed())?;
        this.pending.extend_from_slice(&buf[..=newline]);
        let line = std::mem::take(&mut this.pending);
        this.queue.send_item(line).map_err(|_| closed())?;
        Poll::Ready(Ok(newline + 1))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Whole lines are already queued; an unfinished one waits for its
        // newline by design.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.queue.is_closed() {
            return Poll::Ready(Ok(()));
        }
        ready!(this.queue.poll_reserve(cx)).map_err(|_| closed())?;
        this.pending.clear();
        let close = protocol::encode_control(&HostMessage::CloseStdin {});
        this.queue.send_item(close).map_err(|_| closed())?;
        this.queue.close();
        Poll::Ready(Ok(()))
    }
}

fn closed() -> io::Error {
    io::Error::new(
        io::ErrorKind::BrokenPipe,
        "the channel to the unit's init has ended",
    )
}

#[cfg(test)]
mod tests;
