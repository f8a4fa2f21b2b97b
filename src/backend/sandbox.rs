//! Process-level confinement shared by the local backend and the executor:
//! landlock (read the system, write only the workspace and temp), no_new_privs,
//! rlimits. Linux-only.
//!
//! Interface stub: the local-backend work fills this in.

use std::path::Path;

use crate::plan::Requirement;

/// What confinement was achieved on this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Confinement {
    /// The landlock ABI the kernel offers (0 = none).
    pub landlock_abi: u32,
    /// Whether landlock is enforced on this process (and so its children).
    pub landlock_enforced: bool,
    /// Whether no_new_privs is set.
    pub no_new_privileges: bool,
}

/// Confine the executor process itself before it serves: writes only beneath
/// `root` and the temp directories, no_new_privs. With `Required`, failing to
/// enforce landlock is an error naming the control; with `BestEffort` the
/// result says what was achieved.
pub fn confine_executor(root: &Path, landlock: Requirement) -> Result<Confinement, String> {
    let _ = (root, landlock);
    Ok(Confinement::default())
}
