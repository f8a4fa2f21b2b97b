//! The host: a session's life, from the box ask at initialize to the removal of
//! its units.
