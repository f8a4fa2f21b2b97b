//! The backends this binary is built with, in `--backend auto`'s order:
//! docker when its engine answers, else local.

use std::sync::Arc;

use box_backend::{Backend, BackendKind, Registry};

/// The registry `box serve`, `box run`, `box units`, `box gc` and `box doctor`
/// choose from.
pub fn registry() -> Registry {
    Registry::new()
        .with(BackendKind::Docker, || {
            Box::pin(async {
                box_backend_docker::DockerBackend::connect()
                    .await
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
