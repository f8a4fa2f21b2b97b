//! The executor: the MCP server that runs inside a unit (`box execute`). The
//! tools (dax's seven and box's namespace operations), facts and stamps, the
//! files resources, the process methods and
//! batches, all confined beneath one workspace root. It is started from an
//! [`ExecutorSpec`] and never sees the host: no backend, no session, no engine.
//!
//! Ownership inside this crate: `server` (rmcp handler: capability, listing,
//! dispatch, resources, custom methods), `transport` (stdio framing that
//! answers bad lines), `schema` (exact keys and schema types), `tools` (the
//! tool table, stamps, the file tools), `batch` (the barrier model), `files`
//! (the files resource), `workspace` (confinement, the write lock, the read
//! ledger), `facts` and `stamp` (shared types); `bash` and `bash::analysis`
//! (running and analysing a bash line), `process` (the process methods).
//!
//! One idea first: nothing a tool does names a path the kernel resolves from
//! anywhere but the root's directory handle, so `..` and links cannot lead out
//! whatever the model writes.

pub(crate) mod bash;
mod batch;
pub(crate) mod facts;
mod files;
pub(crate) mod names;
pub(crate) mod process;
mod schema;
mod server;
pub(crate) mod stamp;
mod tools;
mod transport;
pub(crate) mod workspace;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;

/// The read limit when the spec gives none (`max_read_bytes` 0).
const DEFAULT_MAX_READ_BYTES: u64 = 2 * 1024 * 1024;

use box_policy::executor::{
    BIND_ON_STDIN_VAR, Bind, MAX_SECRETS_LINE, SECRET_VALUE_PREFIX, SECRETS_DIR,
    SECRETS_ON_STDIN_VAR, SecretFile,
};
pub use box_policy::executor::{BashOutput, ExecutorSpec};

/// The variable that asks for JSON log lines (`BOX_LOG_FORMAT=json`): a
/// unit's executor gets it from its backend, whose host re-emits each line
/// at its level with its fields. Never handed on to children.
pub const LOG_FORMAT_VAR: &str = "BOX_LOG_FORMAT";

/// Serve MCP on stdin/stdout until the client hangs up (or SIGTERM/SIGINT);
/// exit status 0 either way. Logs are text on stderr, or JSON lines when
/// [`LOG_FORMAT_VAR`] says `json`.
pub fn serve(spec: ExecutorSpec) -> anyhow::Result<std::process::ExitCode> {
    let json = std::env::var(LOG_FORMAT_VAR).is_ok_and(|format| format == "json");
    serve_logging(spec, json)
}

/// [`serve`] with JSON log lines: the executor of a local unit, whose
/// environment is the unit's (the helper replaced it), so no variable can say so.
pub fn serve_json_logs(spec: ExecutorSpec) -> anyhow::Result<std::process::ExitCode> {
    serve_logging(spec, true)
}

fn serve_logging(spec: ExecutorSpec, json_logs: bool) -> anyhow::Result<std::process::ExitCode> {
    init_logging(json_logs);
    // A pooled unit's executor waits here, unconfined but serving nothing,
    // until a session claims its unit: the session's plan then replaces the
    // flags, environment and secrets it started with, and everything below
    // (confinement first) runs exactly as in a cold start.
    if std::env::var_os(BIND_ON_STDIN_VAR).is_some() {
        let bind: Bind = serde_json::from_slice(&first_stdin_line(BIND_ON_STDIN_VAR)?).map_err(
            |error| {
                anyhow::anyhow!(
                    "{BIND_ON_STDIN_VAR}: the first line of stdin is not the session's plan (a bind line: spec, env, secrets): {error}"
                )
            },
        )?;
        if let Some(limits) = bind.rlimits {
            // Lowered, soft and hard, before anything of the session runs:
            // every process the executor starts inherits them.
            let rlimits = box_confine::Rlimits {
                nofile: limits.nofile,
                nproc: limits.nproc,
                data_bytes: limits.data_bytes,
                address_space_bytes: limits.address_space_bytes,
                fsize_bytes: limits.fsize_bytes,
                core_bytes: 0,
            };
            box_confine::apply_rlimits(&rlimits)
                .map_err(|error| anyhow::anyhow!("the session's rlimits: {error}"))?;
        }
        tracing::info!("session's plan bound to this pooled executor");
        let env = bind
            .env
            .into_iter()
            .map(|(name, value)| (name.into(), value.into()))
            .collect();
        return serve_bound(bind.spec, env, Some(bind.secrets));
    }
    // The secrets' values, before confinement: /run/secrets is written once, then only read.
    let given = if std::env::var_os(SECRETS_ON_STDIN_VAR).is_some() {
        Some(secrets_from_stdin()?)
    } else {
        None
    };
    serve_bound(spec, std::env::vars_os().collect(), given)
}

/// Serve `spec` with `env` as this executor's own environment (the source of
/// its children's) and the secrets `given` (else from `BOX_SECRET_NAME` variables).
fn serve_bound(
    spec: ExecutorSpec,
    env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
    given: Option<std::collections::BTreeMap<String, String>>,
) -> anyhow::Result<std::process::ExitCode> {
    use box_policy::executor::{FlagValue as _, SeccompLayer, WriteGuard};
    let args = &spec;
    let kind = spec.kind.name().to_owned();
    let write_guard = spec.write_guard == WriteGuard::ReadFirst;
    let landlock = spec.landlock;
    let bash_output = spec.bash_output;
    let max_read_bytes = if spec.max_read_bytes == 0 {
        DEFAULT_MAX_READ_BYTES
    } else {
        spec.max_read_bytes
    };
    let workspace = workspace::Workspace::open(&args.root)
        .with_context(|| format!("--root {}: cannot open the workspace", args.root.display()))?
        .with_write_guard(write_guard);
    if !workspace.dir().dir_metadata().is_ok_and(|m| m.is_dir()) {
        anyhow::bail!("--root {}: not a directory", args.root.display());
    }
    let reference = args.reference.clone().unwrap_or_else(host_name);
    let secret_vars = deliver_secrets(&spec.secrets, Path::new(SECRETS_DIR), given.as_ref(), &env)?;
    // The values' carriers never reach a child, whatever the pass list says.
    // They stay in this process's initial environment block (what
    // /proc/self/environ shows; removing a variable never clears it), which
    // only this process can read: it is not dumpable (seccomp layer).
    let own_vars = env
        .into_iter()
        .filter(|(name, _)| !name.to_string_lossy().starts_with(SECRET_VALUE_PREFIX));
    // Bound before confinement (landlock may restrict binding later), served after
    // it (landlock confines only the thread that asks, so no thread may exist yet).
    let egress = match &args.egress_socket {
        Some(socket) => {
            let address = std::net::SocketAddr::from(([127, 0, 0, 1], box_egress::BRIDGE_PORT));
            let listener = std::net::TcpListener::bind(address).with_context(|| {
                format!("--egress-socket: cannot listen on {address} for the egress bridge")
            })?;
            Some((listener, socket.clone()))
        }
        None => None,
    };
    let scrubbed = box_scrub::scrub_environment(own_vars, &args.pass_env);
    // The unit's git-neutralising GIT_CONFIG_* (100+ names) are expected
    // there, and children get the executor's own: named only at DEBUG.
    let (git_config, removed): (Vec<&String>, Vec<&String>) = scrubbed
        .removed
        .iter()
        .partition(|name| name.starts_with("GIT_CONFIG_"));
    if !removed.is_empty() {
        let removed = names(&removed);
        tracing::info!(%removed, "variables scrubbed from children's environment");
    }
    if !git_config.is_empty() {
        let removed = names(&git_config);
        tracing::debug!(%removed, "GIT_CONFIG_* variables scrubbed from children's environment");
    }
    // The secrets' tmpfs, and what the backend bound in read-only for the
    // tools (a worktree fork's borrowed git objects, which its git must read).
    let extra_read: Vec<PathBuf> = (!spec.secrets.is_empty())
        .then(|| PathBuf::from(SECRETS_DIR))
        .into_iter()
        .chain(args.read.iter().cloned())
        .collect();
    // The bridge connects to the proxy's socket after confinement, once per
    // connection: landlock must leave its directory connectable (ABI 9 mediates it).
    let unix_connect: Vec<PathBuf> = args
        .egress_socket
        .iter()
        .filter_map(|socket| socket.parent().map(Path::to_path_buf))
        .collect();
    match box_confine::confine_executor_with(
        workspace.root(),
        landlock,
        &extra_read,
        &args.write,
        &unix_connect,
    ) {
        Ok(confinement) => tracing::info!(
            landlock_abi = confinement.landlock_abi,
            landlock_enforced = confinement.landlock_enforced,
            no_new_privileges = confinement.no_new_privileges,
            "executor confined"
        ),
        Err(error) => anyhow::bail!("--landlock {}: {error}", args.landlock.name()),
    }
    // After landlock (which wants the process single-threaded) and before the
    // runtime starts threads; the filter is synchronised to every thread anyway.
    // A unit's envelope claims this layer, so failing to install it fails the start.
    match args.seccomp {
        SeccompLayer::On => match box_confine::seccomp::install_box_filter() {
            Ok(report) => tracing::info!(
                rules = report.rules,
                instructions = report.instructions,
                filters = report.filters,
                "box seccomp filter installed; executor not dumpable"
            ),
            Err(error) => anyhow::bail!("--seccomp on: {error}"),
        },
        SeccompLayer::Off => {
            tracing::warn!("--seccomp off: box's own seccomp layer is not applied")
        }
    }
    let mut child_env = scrubbed.kept;
    child_env.retain(|(name, _)| name != LOG_FORMAT_VAR);
    if let Some((listener, socket)) = egress {
        let address = listener
            .local_addr()
            .context("the egress bridge's address")?;
        // Children find the bridge through the proxy variables; the unit has no
        // other way out (no route, no resolver).
        for (name, value) in box_egress::proxy_environment(address) {
            child_env.retain(|(kept, _)| kept != name);
            child_env.push((name.into(), value.into()));
        }
        start_bridge(listener, socket)?;
        tracing::info!(%address, "egress bridge listening");
    }
    // The confinement denies the home directory (a user's git configuration
    // may hold credentials: tokens in `url.*.insteadOf`, helpers, so it is
    // not opened to children either), and git fails outright on a global
    // configuration it cannot open. Children's git is told it is empty; a
    // readable one (landlock off, a HOME inside the allowed paths) is kept.
    if let Some(path) = box_scrub::unreadable_global_config(&child_env) {
        tracing::info!(
            path = %path.display(),
            "the global git configuration cannot be read here; children get GIT_CONFIG_GLOBAL=/dev/null"
        );
        child_env.retain(|(name, _)| name != "GIT_CONFIG_GLOBAL");
        child_env.push(("GIT_CONFIG_GLOBAL".into(), "/dev/null".into()));
    }
    // Secrets asked for as variables reach the processes this executor
    // starts, after the scrubber (which would remove them by name).
    child_env.extend(secret_vars);
    let shared = Arc::new(server::Shared::new(
        server::Settings {
            kind,
            reference,
            max_read_bytes,
            bash_output,
        },
        workspace,
        child_env,
    ));
    // One thread serves the protocol: a call's read, dispatch and answer then
    // cost no thread hand-off (the multi-threaded runtime spent 41% of a small
    // call in the scheduler). The tree walks, facts, writes and git probes go
    // to the blocking pool; read and ls run in place (see `tools::call`).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let result = runtime.block_on(run(shared));
    // A terminal's pending read of stdin cannot be cancelled; do not wait for it.
    runtime.shutdown_timeout(Duration::from_millis(100));
    result.map(|()| std::process::ExitCode::SUCCESS)
}

/// The secrets' values from the first line of stdin ([`SECRETS_ON_STDIN_VAR`]):
/// read a byte at a time from fd 0, so nothing after the line (the
/// protocol) is consumed here.
fn secrets_from_stdin() -> anyhow::Result<std::collections::BTreeMap<String, String>> {
    let line = first_stdin_line(SECRETS_ON_STDIN_VAR)?;
    serde_json::from_slice(&line).map_err(|error| {
        anyhow::anyhow!(
            "{SECRETS_ON_STDIN_VAR}: the first line of stdin is not a JSON object of secret names to values: {error}"
        )
    })
}

/// The first line of stdin, which the host writes before any protocol
/// message (`var` says why it is expected): read a byte at a time from fd
/// 0, so nothing after the line (the protocol) is consumed here.
fn first_stdin_line(var: &str) -> anyhow::Result<Vec<u8>> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        match nix::unistd::read(std::io::stdin(), &mut byte) {
            Ok(0) => anyhow::bail!("{var}: stdin ended before the line the host writes first"),
            Ok(_) if byte[0] == b'\n' => break,
            Ok(_) => {
                line.push(byte[0]);
                if line.len() > MAX_SECRETS_LINE {
                    anyhow::bail!("{var}: the first line is longer than {MAX_SECRETS_LINE} bytes");
                }
            }
            Err(nix::errno::Errno::EINTR) => {}
            Err(error) => anyhow::bail!("{var}: reading stdin: {error}"),
        }
    }
    Ok(line)
}

/// Write each secret to `dir/NAME` (mode 0400, this process's user) from
/// `given` (the stdin line) or else its `BOX_SECRET_NAME` variable; the
/// `as_env` ones come back as `(NAME, value)` for the children's environment.
fn deliver_secrets(
    secrets: &[SecretFile],
    dir: &Path,
    given: Option<&std::collections::BTreeMap<String, String>>,
    env: &[(std::ffi::OsString, std::ffi::OsString)],
) -> anyhow::Result<Vec<(std::ffi::OsString, std::ffi::OsString)>> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut vars = Vec::new();
    for secret in secrets {
        let carrier = format!("{SECRET_VALUE_PREFIX}{}", secret.name);
        let value = match given {
            Some(given) => given.get(&secret.name).map(std::ffi::OsString::from),
            None => env
                .iter()
                .find(|(name, _)| name.as_os_str() == carrier.as_str())
                .map(|(_, value)| value.clone()),
        };
        let Some(value) = value else {
            anyhow::bail!(
                "--secrets {}: its value was not handed over ({carrier}, or the host's secrets line on stdin); the backend hands each secret's value to the executor",
                secret.name
            );
        };
        let path = dir.join(&secret.name);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o400)
            .open(&path)
            .with_context(|| {
                format!(
                    "--secrets {}: cannot create {} (the backend mounts a tmpfs owned by the unit's user at {})",
                    secret.name,
                    path.display(),
                    dir.display()
                )
            })?;
        file.write_all(value.as_encoded_bytes())
            .with_context(|| format!("--secrets {}: writing {}", secret.name, path.display()))?;
        if secret.as_env {
            vars.push((secret.name.clone().into(), value));
        }
    }
    if !secrets.is_empty() {
        let names: Vec<&String> = secrets.iter().map(|secret| &secret.name).collect();
        let names = crate::names(&names);
        tracing::info!(%names, dir = %dir.display(), "secrets delivered as files");
    }
    Ok(vars)
}

/// Run the egress bridge on its own thread and runtime, so a busy download never
/// shares the protocol's thread.
fn start_bridge(listener: std::net::TcpListener, socket: std::path::PathBuf) -> anyhow::Result<()> {
    listener
        .set_nonblocking(true)
        .context("the egress bridge's listener")?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the egress bridge's runtime")?;
    std::thread::Builder::new()
        .name("egress-bridge".to_owned())
        .spawn(move || {
            runtime.block_on(async move {
                let listener = match tokio::net::TcpListener::from_std(listener) {
                    Ok(listener) => listener,
                    Err(error) => {
                        return tracing::error!(%error, "egress bridge cannot listen");
                    }
                };
                if let Err(error) = box_egress::bridge(listener, socket).await {
                    tracing::error!(%error, "egress bridge stopped");
                }
            })
        })
        .context("cannot start the egress bridge's thread")?;
    Ok(())
}

/// Serve until the client hangs up or a signal ends it, then end every process.
async fn run(shared: Arc<server::Shared>) -> anyhow::Result<()> {
    use rmcp::ServiceExt as _;
    use tokio::signal::unix::{SignalKind, signal};

    let mut terminate = signal(SignalKind::terminate()).context("cannot watch SIGTERM")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot watch SIGINT")?;
    let handler = server::Executor::new(Arc::clone(&shared));
    let (reader, writer, _modes) = transport::stdio();
    let service = tokio::select! {
        service = handler.serve(transport::LineTransport::new(reader, writer)) => service,
        _ = terminate.recv() => return Ok(()),
        _ = interrupt.recv() => return Ok(()),
    };
    let service = match service {
        Ok(service) => service,
        Err(error) => {
            // A client that leaves before initializing ends nothing.
            tracing::info!("no session: {error}");
            return Ok(());
        }
    };
    let cancel = service.cancellation_token();
    let mut waiting = std::pin::pin!(service.waiting());
    tokio::select! {
        _ = &mut waiting => {
            tracing::info!("client hung up");
            shared.session().processes.shutdown().await;
        }
        _ = terminate.recv() => {
            tracing::info!("SIGTERM: ending processes, then the session");
            shared.session().processes.shutdown().await;
            cancel.cancel();
        }
        _ = interrupt.recv() => {
            tracing::info!("SIGINT: ending processes, then the session");
            shared.session().processes.shutdown().await;
            cancel.cancel();
        }
    }
    Ok(())
}

/// Variable names as a log field's value: `A, B`.
fn names(names: &[&String]) -> String {
    names
        .iter()
        .map(|name| name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Logs go to stderr only: stdout is the protocol. rmcp's own warning on an
/// error answer is off (it prints the error's Rust `Debug` form):
/// `transport::ExecutorTransport::send` logs each error answer instead.
fn init_logging(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("BOX_LOG").unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new("warn,rmcp::service=error,box_executor=info")
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false);
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

/// This machine's name, for the descriptor's default ref.
fn host_name() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|name| name.into_string().ok())
        .unwrap_or_default()
}

/// Everything a tool call needs from its executor: shared by every call of one
/// executor process.
pub(crate) struct Context {
    /// The confined workspace every path resolves beneath.
    pub workspace: Arc<workspace::Workspace>,
    /// The scrubbed environment every child (bash, processes, git probes) gets.
    #[allow(dead_code, reason = "read by bash and process, whose stubs do not yet")]
    pub child_env: Arc<Vec<(std::ffi::OsString, std::ffi::OsString)>>,
    /// This process's stamp key.
    pub stamp: stamp::StampKey,
    /// The most bytes of a file the tools read.
    pub max_read_bytes: u64,
    /// What bash output does with terminal control characters.
    pub bash_output: BashOutput,
}

/// What a tool call produced, before it becomes an MCP result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ToolOutcome {
    /// The one text block of the result.
    pub text: String,
    /// Whether the result is an error result (`isError: true`).
    pub is_error: bool,
    /// Whether the call failed in the batch sense (an error result, or bash
    /// exiting non-zero, timing out or being killed; stderr alone is not failure).
    pub failed: bool,
}

impl ToolOutcome {
    /// A successful result.
    pub fn ok(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            is_error: false,
            failed: false,
        }
    }

    /// An error result.
    pub fn error(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            is_error: true,
            failed: true,
        }
    }
}

/// Where a running tool sends progress text (bash output since the last report).
/// Lossy on purpose: a full channel drops the update, never the call.
pub(crate) type Progress = Option<tokio::sync::mpsc::Sender<String>>;
