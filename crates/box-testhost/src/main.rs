//! `box-testhost`: the `box` command line with the fake backend registered
//! (`--backend fake`), for integration tests that drive a real `box serve`
//! process without an engine. A crate of its own (the fake is box-testkit's),
//! so box-testkit never depends on the root package; no release carries it.

use std::sync::Arc;

use box_backend::Backend;
use box_testkit::fake::FakeBackend;

fn main() -> std::process::ExitCode {
    boxhost::backends::install(
        boxhost::backends::standard().with(box_testkit::fake::KIND, || {
            // The host logs which backend it uses, and every envelope says "fake".
            Box::pin(async { Ok(Arc::new(FakeBackend::default()) as Arc<dyn Backend>) })
        }),
    );
    boxhost::cli::main()
}
