//! The backends a binary was built with, chosen by kind: the binary registers
//! docker and local, tests register the fake; nothing matches strings to
//! constructors anywhere else.

use std::sync::Arc;

use futures::future::BoxFuture;

use crate::{Backend, BackendKind};

/// Connect to one backend, or say why it cannot be used here.
pub type Connect = fn() -> BoxFuture<'static, Result<Arc<dyn Backend>, String>>;

/// The backends to choose from, in preference order (`auto` takes the first
/// that connects).
#[derive(Default, Clone)]
pub struct Registry {
    entries: Vec<(BackendKind, Connect)>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.kinds()).finish()
    }
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Add a backend; earlier ones are preferred by [`Registry::auto`].
    pub fn with(mut self, kind: BackendKind, connect: Connect) -> Self {
        self.entries.push((kind, connect));
        self
    }

    /// The kinds registered, in preference order.
    pub fn kinds(&self) -> impl Iterator<Item = BackendKind> + '_ {
        self.entries.iter().map(|(kind, _)| *kind)
    }

    /// The registered kind named `name`.
    pub fn kind(&self, name: &str) -> Option<BackendKind> {
        self.kinds().find(|kind| kind.as_str() == name)
    }

    /// The names to choose from, for a refusal: `docker or local`, with
    /// `auto` first when `auto` is one of them.
    pub fn choices(&self, auto: bool) -> String {
        let mut names: Vec<&str> = if auto { vec!["auto"] } else { Vec::new() };
        names.extend(self.kinds().map(BackendKind::as_str));
        match names.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
            _ => names.join(""),
        }
    }

    /// The backend named `name` (`docker`, `local`...), or why not.
    pub async fn connect(&self, name: &str) -> Result<Arc<dyn Backend>, String> {
        match self.entries.iter().find(|(kind, _)| kind.as_str() == name) {
            Some((_, connect)) => connect().await,
            None => Err(format!("choose {}", self.choices(true))),
        }
    }

    /// The first backend that connects, and why each one before it did not.
    pub async fn auto(&self) -> Result<(Arc<dyn Backend>, Vec<(BackendKind, String)>), String> {
        let mut skipped = Vec::new();
        for (kind, connect) in &self.entries {
            match connect().await {
                Ok(backend) => return Ok((backend, skipped)),
                Err(why) => skipped.push((*kind, why)),
            }
        }
        Err(skipped
            .iter()
            .map(|(kind, why)| format!("{}: {why}", kind.as_str()))
            .collect::<Vec<_>>()
            .join("; "))
    }
}
