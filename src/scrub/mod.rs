//! Environment scrubbing and git neutralisation: one place, used by the host
//! (a unit's environment), the executor (every child it starts) and any git the
//! host itself runs.
