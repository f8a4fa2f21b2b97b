//! box's test doubles, for the host's tests, the integration tests and the
//! benchmarks: [`fake::FakeBackend`], whose units are in-process fake
//! executors. A dev-dependency only: the `box` binary never links it (the
//! tidy test checks).

pub mod fake;
