//! See main.rs for what belongs here.
