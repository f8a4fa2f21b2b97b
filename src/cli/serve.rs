//! `box serve`: its flags, turned into the host's [`ServeConfig`] and the
//! HTTP transport's [`HttpOptions`], and the wiring of the two: the host
//! starts, a transport serves its sessions (through [`HostSessions`]), the
//! host says what is left.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use box_transport::http::{self, HttpOptions};
use box_transport::{AskPart, TransportAsk};

use crate::cli::LogFormat;
use crate::host::{self, ServeConfig};
use crate::process;
use crate::sessions::HostSessions;

/// `box serve`: the host, over stdio or streamable HTTP.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = format!("{SERVE_EXAMPLES}\n\n{}", crate::cli::LOGGING))]
pub struct ServeArgs {
    /// The profile a session gets when it names none.
    #[arg(long, value_name = "NAME", default_value = "default", add = clap_complete::ArgValueCandidates::new(crate::cli::complete::profile_names))]
    pub profile: String,
    /// Over stdio: tightenings the session asks for, as JSON or @FILE (as
    /// `box run --tighten`), for clients that cannot ask themselves. Not with
    /// --listen: each HTTP session asks for its own (the Box-Tighten header).
    #[arg(long, value_name = "JSON")]
    pub tighten: Option<String>,
    /// More directories of profiles, searched first (repeatable).
    #[arg(long = "profiles", value_name = "DIR")]
    pub profile_dirs: Vec<PathBuf>,
    /// Where units run.
    #[arg(long, value_name = "BACKEND", default_value = "auto", value_parser = crate::cli::backend_parser())]
    pub backend: String,
    /// The host directory a `cwd` workspace source means; default the current directory.
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    /// Serve streamable HTTP at this address instead of stdio (a bare port binds 127.0.0.1).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// A file holding the bearer token HTTP clients must send (required off loopback).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Host names (with or without port) HTTP clients may use besides loopback (repeatable).
    #[arg(long = "allow-host", value_name = "HOST")]
    pub allow_hosts: Vec<String>,
    /// Origins (`scheme://host[:port]`) browsers may send besides loopback (repeatable).
    #[arg(long = "allow-origin", value_name = "ORIGIN")]
    pub allow_origins: Vec<String>,
    /// The most sessions served at once over HTTP.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub max_sessions: usize,
    /// The largest HTTP body accepted, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = box_jsonrpc::lines::MAX_MESSAGE_BYTES)]
    pub max_body_bytes: usize,
    /// This host's instance id in unit labels; default one per listen address (HTTP) or per process (stdio).
    #[arg(long, value_name = "ID")]
    pub instance: Option<String>,
    /// Append one JSON line per tool call here (its profile, the client's
    /// name and version, its outcome with a bash call's exit status; no
    /// argument values, no outputs), per refused request or initialize, and
    /// per egress attempt.
    #[arg(long, value_name = "FILE")]
    pub audit: Option<PathBuf>,
    /// Log format on stderr.
    #[arg(long, value_name = "FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// -v/-q: how much is logged.
    #[command(flatten)]
    pub verbosity: crate::cli::Verbosity,
    /// At SIGTERM, how long calls in flight get to finish before units are removed (e.g. 10s).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    pub drain: Duration,
    /// Where sessions' identities are kept, so a restarted `box serve` can
    /// re-adopt their units and its clients reattach (`none`: keep
    /// nothing). Default with --listen: $XDG_STATE_HOME/box/sessions (or
    /// ~/.local/state/box/sessions); on stdio: none. Created 0700; a
    /// directory of another user's, or one its group or others may write,
    /// is refused (box never changes its mode).
    #[arg(long, value_name = "DIR|none")]
    pub state: Option<PathBuf>,
    /// Take over from the `box serve` already serving this address (or
    /// --instance): it is sent SIGHUP, lets its calls finish and exits
    /// leaving its sessions' units, which this process re-adopts.
    #[arg(long, requires = "listen")]
    pub takeover: bool,
    /// Keep N units of PROFILE's workspace started with no session (repeatable;
    /// docker and local): a session whose plan fits claims one, its plan bound
    /// before the unit serves anything, and its envelope says `warm: true`; a
    /// plan that does not fit starts cold and says why. A claimed unit is removed
    /// after its session. Overrides the profile's `[pool] size` (N = 0: no pool).
    #[arg(long = "pool", value_name = "PROFILE=N", value_parser = parse_pool)]
    pub pools: Vec<host::PoolAsk>,
    /// Export traces (OpenTelemetry, OTLP over HTTP, protobuf) to this
    /// collector: a base URL (`http://127.0.0.1:4318`, `/v1/traces` added) or
    /// a full one with its path. Without it, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
    /// or OTEL_EXPORTER_OTLP_ENDPOINT turn tracing on (OTEL_SDK_DISABLED=true
    /// or OTEL_TRACES_EXPORTER=none keep it off); with none, nothing is recorded.
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
}

/// `--pool PROFILE=N`.
fn parse_pool(text: &str) -> Result<host::PoolAsk, String> {
    host::PoolAsk::parse(text)
}

/// `box serve`'s examples, in its `--help`.
const SERVE_EXAMPLES: &str = "Examples:
  box serve
  box serve --profile ci --workspace ~/src/project
  box serve --tighten '{\"limits\": {\"memory\": \"1GiB\"}}'
  box serve --listen 8080
  box serve --listen 8080 --pool default=4
  box serve --listen 0.0.0.0:8080 --token-file /etc/box/token --allow-host box.example.com
  box serve --profiles ./profiles --profile mine --audit /var/log/box/audit.jsonl";

impl ServeArgs {
    /// What the host needs of these flags.
    fn host_config(&self) -> anyhow::Result<ServeConfig> {
        let tracing = box_otel::ExportConfig::from_env(self.otlp_endpoint.as_deref(), |name| {
            std::env::var(name).ok()
        })
        .map_err(|why| anyhow::anyhow!("tracing: {why}"))?;
        Ok(ServeConfig {
            profile: self.profile.clone(),
            profile_dirs: self.profile_dirs.clone(),
            backend: self.backend.clone(),
            registry: crate::backends::registry(),
            workspace: self.workspace.clone(),
            listen: self.listen.clone(),
            instance: self.instance.clone(),
            audit: self.audit.clone(),
            drain: self.drain,
            fork_git: crate::cli::confine::fork_git(),
            state: match &self.state {
                Some(dir) if dir.as_os_str() == "none" => None,
                Some(dir) => Some(dir.clone()),
                None if self.listen.is_some() => Some(host::default_state_dir()),
                None => None,
            },
            takeover: self.takeover,
            pools: self.pools.clone(),
            tracing,
        })
    }

    /// What the stdio session asks for from these flags: `--tighten` (JSON,
    /// or `@FILE`), checked as JSON here so a typo fails at start rather than
    /// at the client's initialize. Refused with `--listen`: HTTP sessions
    /// each ask for themselves, and one flag silently narrowing all of them
    /// would be a second, hidden ask.
    fn stdio_ask(&self) -> anyhow::Result<TransportAsk> {
        let Some(tighten) = &self.tighten else {
            return Ok(TransportAsk::default());
        };
        if self.listen.is_some() {
            anyhow::bail!(
                "--tighten is for the stdio session; with --listen each HTTP session asks for its own tightening (the Box-Tighten header, or box.tighten in its capabilities)"
            );
        }
        let (text, source) = match tighten.strip_prefix('@') {
            Some(path) => {
                let file = std::fs::File::open(path)
                    .with_context(|| format!("--tighten @{path}: reading"))?;
                let mut text = String::new();
                // One byte over the bound is enough to refuse it.
                let bound = box_jsonrpc::session::MAX_ASK_BYTES as u64 + 1;
                std::io::Read::read_to_string(&mut std::io::Read::take(file, bound), &mut text)
                    .with_context(|| format!("--tighten @{path}: reading"))?;
                (text, format!("box serve --tighten @{path}"))
            }
            None => (tighten.clone(), "box serve --tighten".to_owned()),
        };
        let bound = box_jsonrpc::session::MAX_ASK_BYTES;
        if text.len() > bound {
            anyhow::bail!("{source}: over the limit of {bound} bytes; a tightening is small");
        }
        crate::plan::parse_tightening_text(&text).map_err(|error| match error {
            crate::plan::PlanError::Invalid(why) => anyhow::anyhow!("{source}: {why}"),
            other => anyhow::anyhow!("{source}: {other}"),
        })?;
        Ok(TransportAsk {
            tighten: Some(AskPart::new(text, source)),
            ..TransportAsk::default()
        })
    }

    /// What the HTTP transport enforces, from these flags: a non-loopback
    /// `--listen` requires `--token-file`.
    fn http_options(&self) -> anyhow::Result<HttpOptions> {
        let listen = self.listen.as_deref().unwrap_or("127.0.0.1:0");
        let token = match &self.token_file {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("--token-file {}: reading", path.display()))?;
                let token = text.trim().to_owned();
                if token.len() < 16 {
                    anyhow::bail!(
                        "--token-file {}: the token is {} characters; use at least 16 (e.g. `openssl rand -hex 32`)",
                        path.display(),
                        token.len()
                    );
                }
                Some(token)
            }
            None => None,
        };
        let loopback = http::is_loopback_listen(listen);
        if !loopback && token.is_none() {
            anyhow::bail!(
                "--listen {listen} is not a loopback address: anyone who reaches it could run tools; give --token-file FILE (a bearer token clients must send)"
            );
        }
        let mut allowed_hosts = self.allow_hosts.clone();
        if let Ok(address) = listen.parse::<SocketAddr>()
            && !address.ip().is_unspecified()
        {
            allowed_hosts.push(address.ip().to_string());
        }
        Ok(HttpOptions {
            token,
            allowed_hosts,
            allowed_origins: self.allow_origins.clone(),
            max_sessions: self.max_sessions.max(1),
            max_body_bytes: self.max_body_bytes,
            ..HttpOptions::loopback()
        })
    }
}

/// Run the host until its transport ends.
pub fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let asked = args.verbosity.filter("info");
    process::init_logging(args.log_format.as_str(), asked.as_deref(), "info")?;
    let runtime = if args.listen.is_some() {
        process::runtime()?
    } else {
        process::single_session_runtime()?
    };
    let result = runtime.block_on(serve_async(args));
    // The stdio reader may sit in a blocking read of stdin; do not wait for it.
    runtime.shutdown_timeout(Duration::from_millis(200));
    result
}

/// `--listen` as `HOST:PORT`: a bare port (`8080`, `:8080`) binds loopback.
/// A port that is not one (`99999`, `bar`) or a value with no port is
/// refused naming that, before anything is judged by its host.
fn listen_address(value: &str) -> anyhow::Result<String> {
    const FORMS: &str =
        "write HOST:PORT (127.0.0.1:8080, [::1]:8080, localhost:8080) or a bare port (8080)";
    let bare = value.strip_prefix(':').unwrap_or(value);
    let (host, port) = if bare.chars().all(|c| c.is_ascii_digit()) && !bare.is_empty() {
        ("127.0.0.1", bare)
    } else {
        match value.rsplit_once(':') {
            // `::1` and other bare IPv6 addresses: the port is not separable.
            Some((host, _)) if host.contains(':') && !host.starts_with('[') => {
                anyhow::bail!(
                    "--listen {value}: an IPv6 address takes brackets before its port; {FORMS}"
                )
            }
            Some((host, port)) if !host.is_empty() => (host, port),
            _ => anyhow::bail!("--listen {value}: no port; {FORMS}"),
        }
    };
    match port.parse::<u16>() {
        Ok(_) => {}
        Err(_) if !port.is_empty() && port.chars().all(|c| c.is_ascii_digit()) => {
            anyhow::bail!("--listen {value}: port {port} is out of range; a port is 0 to 65535")
        }
        Err(_) => {
            anyhow::bail!("--listen {value}: the port {port:?} is not a number; {FORMS}")
        }
    }
    let ip = host
        .strip_prefix('[')
        .and_then(|inner| inner.strip_suffix(']'));
    if let Some(ip) = ip
        && ip.parse::<std::net::Ipv6Addr>().is_err()
    {
        anyhow::bail!("--listen {value}: {ip} is not an IPv6 address; {FORMS}");
    }
    if ip.is_none() && host.contains(['[', ']']) {
        anyhow::bail!("--listen {value}: unbalanced brackets; {FORMS}");
    }
    Ok(format!("{host}:{port}"))
}

async fn serve_async(mut args: ServeArgs) -> anyhow::Result<ExitCode> {
    args.listen = args.listen.as_deref().map(listen_address).transpose()?;
    crate::cli::check_profile_dirs(&args.profile_dirs)?;
    let stdio_ask = args.stdio_ask()?;
    // Judged before the host starts: a refused flag leaves nothing behind.
    let http = match &args.listen {
        Some(address) => Some((address.clone(), args.http_options()?)),
        None => None,
    };
    let host = host::start(args.host_config()?).await?;
    process::watch_signals(
        host.shutdown.clone(),
        host.config.clone(),
        host.services.clone(),
    )?;
    let sessions = Arc::new(HostSessions::new(
        host.config.clone(),
        host.services.clone(),
    ));
    let shutdown = host.shutdown.clone();
    match http {
        None => box_transport::stdio::serve(sessions, stdio_ask, shutdown).await?,
        Some((address, options)) => {
            let listener = http::bind(&address).await?;
            let address = listener.local_addr()?;
            // The URL a client is given (an IPv6 address in brackets).
            tracing::info!(%address, "serving MCP (streamable HTTP) at http://{address}/mcp");
            http::serve(sessions, options, listener, shutdown).await?;
        }
    }
    host.end_pools().await;
    host.flush_traces().await;
    Ok(host.finish())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_bare_port_binds_loopback() {
        let listen = |value| super::listen_address(value).unwrap();
        assert_eq!(listen("8080"), "127.0.0.1:8080");
        assert_eq!(listen(":8080"), "127.0.0.1:8080");
        assert_eq!(listen("0.0.0.0:8080"), "0.0.0.0:8080");
        assert_eq!(listen("[::1]:8080"), "[::1]:8080");
        assert_eq!(listen("localhost:0"), "localhost:0");
        assert_eq!(listen("box.example.com:8080"), "box.example.com:8080");
    }

    /// Issue 22, item 13: what is wrong with a `--listen` is named, not
    /// taken for a host that is not loopback.
    #[test]
    fn a_listen_address_that_is_not_one_is_refused_naming_its_fault() {
        let refused = |value| super::listen_address(value).unwrap_err().to_string();
        for (value, want) in [
            (
                "127.0.0.1:99999",
                "--listen 127.0.0.1:99999: port 99999 is out of range; a port is 0 to 65535",
            ),
            (
                "99999",
                "--listen 99999: port 99999 is out of range; a port is 0 to 65535",
            ),
            (
                "foo:bar",
                "--listen foo:bar: the port \"bar\" is not a number; write HOST:PORT",
            ),
            (
                "127.0.0.1:",
                "--listen 127.0.0.1:: the port \"\" is not a number;",
            ),
            ("foo", "--listen foo: no port; write HOST:PORT"),
            ("127.0.0.1", "--listen 127.0.0.1: no port;"),
            (
                "::1",
                "--listen ::1: an IPv6 address takes brackets before its port;",
            ),
            ("[zz]:80", "--listen [zz]:80: zz is not an IPv6 address;"),
        ] {
            let error = refused(value);
            assert!(error.starts_with(want), "{value}: {error}");
            assert!(!error.contains("loopback"), "{value}: {error}");
        }
    }
}
