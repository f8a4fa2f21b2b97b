//! Profiles: what a unit may be and do, as written in TOML. Loading, `extends`,
//! validation with precise errors. Pure: no I/O beyond reading profile files.
