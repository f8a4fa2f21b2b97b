//! Profiles: what a session's units may be and do, as written in TOML.
//! Finding them (`--profiles` directories, `$XDG_CONFIG_HOME/box/profiles`,
//! `/etc/box/profiles`, the shipped ones built into the binary), `extends`,
//! and validation with errors that name the file, line, column and field.
//! No I/O beyond reading profile files; narrowing and host facts belong to
//! `plan`. `box profile` lives in the binary.

mod error;
pub(crate) mod fields;
mod kinds;
mod load;
mod model;
mod tree;
mod validate;
mod value;

pub use error::{Position, Problem, ProfileError};
// A profile's own fields, so a tightening of one a session cannot tighten
// is told as that, not as an unknown field.
pub(crate) use fields::{
    LIMIT_FIELDS, LIMITS as LIMITS_FIELDS, LimitKind, LimitValue, Scope as LimitScope,
    TOP as TOP_FIELDS,
};
// A choice's words, the same in a tightening as in a profile.
pub(crate) use kinds::Choice;
pub use kinds::{Show, Shown};
pub use load::{Catalog, Listed, SHIPPED};
pub use model::{
    Danger, EnvPolicy, ForkMode, LimitsPolicy, NetworkPolicy, OnPersisted, Profile, Secret,
    SecurityPolicy, Server, Source, UserChoice, Workspace,
};
pub(crate) use validate::host_path_dangers;
pub use value::{
    ByteSize, CpuQuota, REVIEWED_CAPABILITIES, check_env_name, parse_duration, show_duration,
};

#[cfg(test)]
mod tests;
