//! The commands' clap structs and their conversion into plain configuration.

pub mod doctor;
pub mod execute;
pub mod profile;
pub mod sandbox;
pub mod units;
