//! The commands' clap structs and their conversion into plain configuration.

pub mod profile;
