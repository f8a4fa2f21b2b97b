//! The commands' clap structs and their conversion into plain configuration,
//! and the wiring of the parts each command needs (`serve`: the host and a
//! transport). Library modules never see clap.

pub mod execute;
pub mod profile;
pub mod run;
pub mod serve;
