//! The commands' clap structs and their conversion into plain configuration.

pub mod execute;
pub mod profile;
