//! The backends this binary is built with, in `--backend auto`'s order:
//! docker when its engine answers, else local.

use std::sync::Arc;

use box_backend::{Backend, BackendKind, Registry};

/// The registry a binary installed with [`install`]; the process-wide choice
/// of what a binary was built with, made once in `main`.
static INSTALLED: std::sync::OnceLock<Registry> = std::sync::OnceLock::new();

/// Make `registry` the one this process chooses backends from (the test-only
/// `box-testhost` adds its fake backend this way); first call wins.
pub fn install(registry: Registry) {
    let _ = INSTALLED.set(registry);
}

/// The registry `box serve`, `box run`, `box units`, `box gc` and `box doctor`
/// choose from: the installed one, else [`standard`].
pub fn registry() -> Registry {
    INSTALLED.get().cloned().unwrap_or_else(standard)
}

/// Where the docker backend shows the pulls a unit's start makes (`box run`:
/// the terminal); unset, they are log lines.
static PULL_PROGRESS: std::sync::OnceLock<box_backend_docker::PullSink> =
    std::sync::OnceLock::new();

/// Show the pulls of the docker backends [`standard`] connects on `sink`;
/// first call wins.
pub fn show_pull_progress(sink: box_backend_docker::PullSink) {
    let _ = PULL_PROGRESS.set(sink);
}

/// The backends of the `box` binary: docker, then local.
pub fn standard() -> Registry {
    Registry::new()
        .with(BackendKind::Docker, || {
            Box::pin(async {
                box_backend_docker::DockerBackend::connect()
                    .await
                    .map(|backend| match PULL_PROGRESS.get() {
                        Some(sink) => backend.with_pull_progress(Arc::clone(sink)),
                        None => backend,
                    })
                    .map(|backend| Arc::new(backend) as Arc<dyn Backend>)
                    .map_err(|error| error.to_string())
            })
        })
        .with(BackendKind::Local, || {
            Box::pin(async {
                box_backend_local::LocalBackend::current()
                    .map(|backend| Arc::new(backend) as Arc<dyn Backend>)
                    .map_err(|error| error.to_string())
            })
        })
}

/// A `--backend NAME` value parser over the installed registry's names
/// (clap lists them as the possible values and completes them), so a new
/// backend needs no change in the commands that take one.
pub fn name_parser() -> impl clap::builder::TypedValueParser<Value = BackendKind> {
    use clap::builder::TypedValueParser as _;
    let registry = registry();
    let names: Vec<&'static str> = registry.kinds().map(BackendKind::as_str).collect();
    // The possible values admit only registered names: the fallback is
    // never taken.
    clap::builder::PossibleValuesParser::new(names)
        .map(move |name| registry.kind(&name).unwrap_or(BackendKind::Docker))
}

/// The installed registry's backend named `name`, or why not, naming the
/// choices (as `--filter backend=NAME` refuses).
pub fn named(name: &str) -> Result<BackendKind, String> {
    let registry = registry();
    registry
        .kind(name)
        .ok_or_else(|| format!("no backend `{name}`; choose {}", registry.choices(false)))
}
