//! The host's side of a unit's life, for every backend whose units run
//! box-init's supervisor (a docker unit's `box init`, the local helper's
//! `box_init::supervise`): the unit's run directory under the host's runtime
//! directory, the wait for its init to connect and prove the unit's key,
//! the fencing of an earlier host when a unit is re-adopted, the renewal of
//! its lease, and the executor's stdio relayed over the init's channel.
//!
//! A backend keeps only what is its own: how the unit is created, what it
//! records of it, how its end is watched. The protocol is box-init's
//! (`box_init::host`); this is how a backend drives it, written once.

use std::future::Future;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use box_init::host::{Ended, Lease, UnitChannel, UnitListener};
use box_init::protocol::UnitKey;
use tokio::io::{AsyncWrite, AsyncWriteExt as _, DuplexStream};

use crate::{ExecutorIo, Renewal};

/// The lease epoch of the host that started a unit: a later host that
/// re-adopts it renews above the epoch its init reports ([`reconnect`]).
pub const START_EPOCH: u64 = 1;

/// How long a re-adopting host waits for its first renewal to be confirmed.
const FENCE_WAIT: Duration = Duration::from_secs(5);

/// Bytes of the executor's stdin buffered between the host and the channel.
const STDIN_BUFFER: usize = 64 * 1024;

/// The run directories' parent under `runtime_dir` (every backend's: each
/// directory says by its contents whose unit it is).
pub fn units_dir(runtime_dir: &Path) -> PathBuf {
    runtime_dir.join("units")
}

/// A new run directory, `runtime_dir/units/<128 random bits>`, with `mode`
/// (the parent is made 0700: a unit reaches its own directory through a
/// mount or a handle, never through the parents). Who may reach the socket
/// in it is this mode, which the backend picks: 0755 for a directory
/// mounted into the unit alone, 0711 for one that also holds host files.
pub fn create_run_dir(runtime_dir: &Path, mode: u32) -> Result<PathBuf, String> {
    let parent = units_dir(runtime_dir);
    std::fs::create_dir_all(&parent)
        .map_err(|error| format!("creating {}: {error}", parent.display()))?;
    std::fs::set_permissions(&parent, std::fs::Permissions::from_mode(0o700))
        .map_err(|error| format!("{}: {error}", parent.display()))?;
    let dir = parent.join(format!("{:032x}", rand::random::<u128>()));
    std::fs::create_dir(&dir).map_err(|error| format!("creating {}: {error}", dir.display()))?;
    if let Err(error) = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)) {
        let _ = std::fs::remove_dir(&dir);
        return Err(format!("{}: {error}", dir.display()));
    }
    Ok(dir)
}

/// Write `bytes` to `path`, readable by the host's user only (0600), whole
/// or not at all (staged beside it, then renamed over it). A link planted at
/// the staged name is refused, never followed.
pub fn write_private(path: &Path, bytes: &[u8]) -> Result<(), String> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let staged = path.with_extension("new");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(&staged)
        .map_err(|error| format!("{}: {error}", staged.display()))?;
    file.write_all(bytes)
        .map_err(|error| format!("{}: {error}", staged.display()))?;
    std::fs::rename(&staged, path).map_err(|error| format!("{}: {error}", path.display()))
}

/// Why a unit's init is not connected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unconnected {
    /// The unit ended first (the backend's watch of it said so).
    Ended,
    /// No init proved the key in time, or the socket failed: what happened.
    Failed(String),
}

/// Wait up to `timeout` for the init of the unit named `identity` (the
/// `instance/session/unit` of the host that started it) to connect on
/// `listener` and prove it holds `key`; `ended` resolves when the backend
/// sees the unit end first, which ends the wait at once.
pub async fn accept(
    listener: &UnitListener,
    (key, identity): (&UnitKey, &str),
    timeout: Duration,
    ended: impl Future<Output = ()>,
) -> Result<UnitChannel, Unconnected> {
    tokio::select! {
        accepted = listener.accept(key, identity, timeout) => {
            accepted.map_err(|error| Unconnected::Failed(error.to_string()))
        }
        () = ended => Err(Unconnected::Ended),
    }
}

/// A refused re-adoption: what was being done, and what went wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// What was being done (`reconnecting to the unit's init`).
    pub doing: String,
    /// What went wrong.
    pub message: String,
}

/// Take over a live unit another host process started: listen on its run
/// directory's socket again, accept its init's reconnection (proving `key`
/// for `identity` within `timeout`; `ended` says, as a sentence, that the
/// unit ended first), and renew its lease of `ttl` above the epoch its init
/// holds, confirmed, before anything is relayed: an earlier host still
/// renewing is fenced off from here on. `who` names the unit's end of the
/// channel in errors (`init`, `helper`). Returns the listener (held for as
/// long as the renewals run), the channel and the epoch to renew at.
pub async fn reconnect(
    run_dir: &Path,
    (key, identity): (&UnitKey, &str),
    (timeout, ttl): (Duration, Duration),
    who: &str,
    ended: impl Future<Output = String>,
) -> Result<(UnitListener, UnitChannel, u64), Refused> {
    let refused = |doing: String, message: String| Refused { doing, message };
    let listener = box_init::host::bind(run_dir).map_err(|error| {
        refused(
            format!("listening for the unit's {who} again"),
            error.to_string(),
        )
    })?;
    let connected = tokio::select! {
        accepted = listener.accept(key, identity, timeout) => accepted.map_err(|error| error.to_string()),
        why = ended => Err(why),
    }
    .map_err(|message| refused(format!("reconnecting to the unit's {who}"), message))?;
    // Fence off any earlier host first: nothing is relayed before this.
    let epoch = connected.state.epoch + 1;
    connected
        .lease
        .renew_confirmed(ttl, epoch, FENCE_WAIT)
        .await
        .map_err(|error| refused("renewing the unit's lease".to_owned(), error.to_string()))?;
    Ok((listener, connected, epoch))
}

/// A connected unit as the host drives it: the executor's stdio over the
/// channel, the channel's end, and the renewal of its lease.
pub struct Relay {
    /// The executor's stdin and stdout.
    pub io: ExecutorIo,
    /// Resolves when the init's channel ends, with how.
    pub ended: Ended,
    /// The renewal of the unit's lease, for [`crate::StartedUnit::renewal`].
    pub renewal: Renewal,
}

/// Relay `channel`'s executor stdio and renew its lease of `ttl` at `epoch`
/// every third of the lease until the channel ends or the [`Renewal`] is
/// dropped (then the unit's init ends it when the lease runs out). `held`
/// (the listener, and whatever else must live as long as the unit is
/// wanted) is kept by the renewals; `run_dir` is what a later host binds
/// again to re-adopt the unit. `unit` names it in log lines
/// (`session/unit`).
pub fn relay(
    channel: UnitChannel,
    (ttl, epoch): (Duration, u64),
    run_dir: PathBuf,
    held: impl Send + 'static,
    unit: String,
) -> Relay {
    let UnitChannel {
        reader,
        writer,
        lease,
        ended,
        state: _,
    } = channel;
    let renewal = renew(lease, (ttl, epoch), run_dir, held, unit.clone());
    Relay {
        io: ExecutorIo {
            stdin: Box::pin(stdin_closing(writer, unit)),
            stdout: Box::pin(reader),
        },
        ended,
        renewal,
    }
}

/// Renew `lease` (of `ttl`) at `epoch` every third of it until the channel
/// ends or the returned [`Renewal`] is dropped, holding `held` meanwhile.
fn renew(
    lease: Lease,
    (ttl, epoch): (Duration, u64),
    run_dir: PathBuf,
    held: impl Send + 'static,
    unit: String,
) -> Renewal {
    let task = tokio::spawn(async move {
        let _held = held;
        let interval = Lease::renew_interval(ttl);
        loop {
            tokio::time::sleep(interval).await;
            if let Err(error) = lease.renew(ttl, epoch).await {
                tracing::debug!(unit, %error, "stopped renewing the unit's lease");
                break;
            }
        }
    });
    Renewal::with_run_dir(task.abort_handle(), run_dir)
}

/// A writer for the executor's stdin over the channel: when the host drops
/// it (or shuts it down), the executor's stdin is closed after what was
/// written (the channel's close message), so the executor reads EOF, as it
/// would from a pipe.
fn stdin_closing(
    mut input: impl AsyncWrite + Send + Unpin + 'static,
    unit: String,
) -> DuplexStream {
    let (writer, mut reader) = tokio::io::duplex(STDIN_BUFFER);
    tokio::spawn(async move {
        if let Err(error) = tokio::io::copy(&mut reader, &mut input).await {
            tracing::debug!(unit, %error, "writing to the executor's stdin");
        }
        let _ = input.shutdown().await;
    });
    writer
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn a_run_directory_is_private_below_and_of_the_mode_asked() {
        let runtime = tempfile::tempdir().unwrap();
        let dir = create_run_dir(runtime.path(), 0o711).unwrap();
        assert_eq!(dir.parent().unwrap(), units_dir(runtime.path()));
        let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o711);
        assert_eq!(mode(&units_dir(runtime.path())), 0o700);
        let other = create_run_dir(runtime.path(), 0o755).unwrap();
        assert_ne!(dir, other, "each unit gets a directory of its own");
        assert_eq!(mode(&other), 0o755);
    }

    #[test]
    fn a_private_file_is_the_owners_and_a_planted_link_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("record.json");
        write_private(&path, b"one").unwrap();
        write_private(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let target = dir.path().join("elsewhere");
        std::os::unix::fs::symlink(&target, path.with_extension("new")).unwrap();
        assert!(write_private(&path, b"three").is_err());
        assert!(!target.exists(), "the link was not followed");
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
    }

    #[tokio::test]
    async fn the_wait_for_an_init_ends_when_the_unit_does() {
        let dir = tempfile::tempdir().unwrap();
        let listener = box_init::host::bind(dir.path()).unwrap();
        let key = UnitKey::generate();
        let waited = accept(
            &listener,
            (&key, "i/s/u"),
            Duration::from_secs(30),
            std::future::ready(()),
        )
        .await;
        assert_eq!(waited.err(), Some(Unconnected::Ended));
        let waited = accept(
            &listener,
            (&key, "i/s/u"),
            Duration::from_millis(50),
            std::future::pending(),
        )
        .await;
        assert!(
            matches!(waited, Err(Unconnected::Failed(_))),
            "no init within the timeout"
        );
    }

    #[tokio::test]
    async fn the_executors_stdin_is_shut_down_when_the_host_drops_it() {
        use tokio::io::AsyncReadExt as _;
        let (far, mut near) = tokio::io::duplex(1024);
        let mut stdin = stdin_closing(far, "s/u".to_owned());
        stdin.write_all(b"{}\n").await.unwrap();
        drop(stdin);
        let mut seen = Vec::new();
        near.read_to_end(&mut seen).await.unwrap();
        assert_eq!(seen, b"{}\n", "what was written, then the end");
    }
}
