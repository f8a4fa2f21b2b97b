//! Backends: turn a unit spec into a running unit (docker, local) and report
//! what was applied as an envelope. Decides nothing.
