//! Environment scrubbing and git neutralisation: one place, used by the host
//! (a unit's environment), the executor (every child it starts) and any git the
//! host itself runs.
//!
//! Interface stub: the scrub work fills this in.

use std::ffi::OsString;

/// An environment after scrubbing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scrubbed {
    /// The variables that stay, in their original order.
    pub kept: Vec<(OsString, OsString)>,
    /// The names of the variables removed (never their values).
    pub removed: Vec<String>,
}

/// Remove credentials and dangerous variables from `vars`; names in `pass`
/// (exact case) are kept even when they look like credentials.
pub fn scrub_environment<I>(vars: I, pass: &[String]) -> Scrubbed
where
    I: IntoIterator<Item = (OsString, OsString)>,
{
    let _ = pass;
    Scrubbed {
        kept: vars.into_iter().collect(),
        removed: Vec::new(),
    }
}

/// The variables that neutralise git's dangerous configuration for a child:
/// `GIT_CONFIG_COUNT`/`KEY_n`/`VALUE_n` and the prompt, pager and lock settings.
pub fn git_neutralisation() -> Vec<(String, String)> {
    Vec::new()
}
