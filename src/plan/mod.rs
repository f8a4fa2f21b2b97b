//! Plans: a profile narrowed by a session's tightenings and resolved into the
//! fully defaulted description of every unit of a session. Pure functions.
