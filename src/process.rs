//! What a box process sets up around the host, and the host never does
//! itself: its log on stderr, its async runtime, and its signals (the first
//! SIGTERM or SIGINT ends the host's sessions, a later one exits now, SIGHUP
//! with a state directory hands the kept sessions to the next process).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use crate::host::{self, HostConfig, Services};

/// The variable holding box's log filter (tracing's syntax: `debug`,
/// `info,box_host=debug`); `RUST_LOG` is read when it is unset.
pub const LOG_VAR: &str = "BOX_LOG";

/// Start logging on stderr (stdout may be the protocol). The filter is the
/// first of: `asked` (the command's -v/-q), `BOX_LOG`, `RUST_LOG`, then
/// `default`. A `BOX_LOG` that is not a filter is refused naming it; a
/// `RUST_LOG` that is not (it is other programs' too) is passed over.
pub fn init_logging(format: &str, asked: Option<&str>, default: &str) -> anyhow::Result<()> {
    let filter = log_filter(
        asked,
        std::env::var(LOG_VAR).ok().as_deref(),
        std::env::var("RUST_LOG").ok().as_deref(),
        default,
    )?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Colour only on a terminal, and never when NO_COLOR is set (no-color.org).
        .with_ansi(
            std::io::IsTerminal::is_terminal(&std::io::stderr())
                && std::env::var_os("NO_COLOR").is_none_or(|value| value.is_empty()),
        )
        .with_writer(std::io::stderr);
    let result = match format {
        "text" => builder.try_init(),
        "json" => builder.json().try_init(),
        other => anyhow::bail!("--log-format {other}: choose text or json"),
    };
    // A second init (tests) keeps the first subscriber.
    let _ = result;
    Ok(())
}

/// The log filter [`init_logging`] uses, from what was asked and the
/// variables' values. Pure.
fn log_filter(
    asked: Option<&str>,
    box_log: Option<&str>,
    rust_log: Option<&str>,
    default: &str,
) -> anyhow::Result<tracing_subscriber::EnvFilter> {
    use tracing_subscriber::EnvFilter;
    if let Some(asked) = asked {
        return EnvFilter::try_new(asked)
            .map_err(|error| anyhow::anyhow!("log filter {asked}: {error}"));
    }
    if let Some(text) = box_log.filter(|text| !text.trim().is_empty()) {
        return EnvFilter::try_new(text).map_err(|error| {
            anyhow::anyhow!(
                "{LOG_VAR}={text}: not a log filter ({error}); write a level (`{LOG_VAR}=debug`) or directives (`{LOG_VAR}=info,box_host=debug`)"
            )
        });
    }
    if let Some(filter) = rust_log
        .filter(|text| !text.trim().is_empty())
        .and_then(|text| EnvFilter::try_new(text).ok())
    {
        return Ok(filter);
    }
    Ok(EnvFilter::new(default))
}

/// Signals that come within this long of the first are the same request:
/// `timeout` and CI job cancellation signal both box and its process group,
/// so one request often arrives as two signals.
const SIGNAL_WINDOW: Duration = Duration::from_secs(1);
/// When a later signal says "exit now", how long box still spends removing
/// the units it knows before it exits naming those left.
const EXIT_NOW_REMOVAL: Duration = Duration::from_secs(5);
/// Cancel `shutdown` at the first SIGTERM or SIGINT; signals within
/// [`SIGNAL_WINDOW`] of it are the same request. A later one exits now, after
/// at most [`EXIT_NOW_REMOVAL`] spent removing the units the ledger knows,
/// naming each unit left and how to remove it. Returns where the first
/// signal's exit code (143 for SIGTERM, 130 for SIGINT) is set before
/// `shutdown` is cancelled.
pub fn watch_signals(
    shutdown: CancellationToken,
    config: Arc<HostConfig>,
    services: Arc<Services>,
) -> anyhow::Result<Arc<std::sync::OnceLock<u8>>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut hangup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
    let first_code = Arc::new(std::sync::OnceLock::new());
    let first_code_set = first_code.clone();
    tokio::spawn(async move {
        let mut first: Option<tokio::time::Instant> = None;
        loop {
            let code: u8 = tokio::select! {
                _ = term.recv() => 143,
                _ = interrupt.recv() => 130,
                _ = hangup.recv(), if first.is_none() && services.state.is_some() => {
                    first = Some(tokio::time::Instant::now());
                    tracing::info!("SIGHUP: handing the kept sessions to the next `box serve --state` process: their calls drain, then this process exits leaving their units");
                    services.handoff.store(true, std::sync::atomic::Ordering::SeqCst);
                    shutdown.cancel();
                    tokio::spawn(exit_when_handed_off(config.clone(), services.clone()));
                    continue;
                }
            };
            match first {
                None => {
                    first = Some(tokio::time::Instant::now());
                    let _ = first_code_set.set(code);
                    tracing::info!(
                        "signal received: ending sessions and removing their units (a signal {} or more later exits at once)",
                        humantime::format_duration(SIGNAL_WINDOW)
                    );
                    shutdown.cancel();
                }
                Some(at) if at.elapsed() < SIGNAL_WINDOW => {
                    tracing::debug!("a repeated signal within the window: the same request");
                }
                Some(_) => {
                    tracing::warn!(
                        "second signal: exiting now, after removing what can be removed within {}",
                        humantime::format_duration(EXIT_NOW_REMOVAL)
                    );
                    let _ =
                        tokio::time::timeout(EXIT_NOW_REMOVAL, host::remove_known_units(&services))
                            .await;
                    host::report_units_left(&config, &services);
                    std::process::exit(code.into());
                }
            }
        }
    });
    Ok(first_code)
}

/// After a SIGHUP: exit once every session is handed off (parked) or ended,
/// bounded by the drain and the end wait.
async fn exit_when_handed_off(config: Arc<HostConfig>, services: Arc<Services>) {
    let deadline = tokio::time::Instant::now() + config.drain + host::END_WAIT;
    loop {
        let parked = services.parked.load(std::sync::atomic::Ordering::SeqCst);
        if parked >= services.metrics.session_tasks() || tokio::time::Instant::now() >= deadline {
            tracing::info!(sessions = parked, "handed off; exiting");
            std::process::exit(0);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The multi-threaded runtime (HTTP, `box run`).
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// One thread for one session (stdio): every hop of a call (client line,
/// session, unit writer, the engine's stream, the answer) is a task switch on
/// this thread, not a wake of another worker through a futex, which is most
/// of a proxied call's added latency on the multi-threaded runtime (measured
/// in BENCHMARKS.md, Serve).
pub fn single_session_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

#[cfg(test)]
mod tests {
    use super::log_filter;

    fn chosen(asked: Option<&str>, box_log: Option<&str>, rust_log: Option<&str>) -> String {
        log_filter(asked, box_log, rust_log, "info")
            .unwrap()
            .to_string()
    }

    #[test]
    fn flags_then_box_log_then_rust_log_then_the_default() {
        assert_eq!(
            chosen(Some("warn,box=debug"), Some("trace"), Some("error")),
            "box=debug,warn"
        );
        assert_eq!(
            chosen(None, Some("box_host=debug"), Some("error")),
            "box_host=debug"
        );
        assert_eq!(chosen(None, None, Some("error")), "error");
        assert_eq!(chosen(None, Some(" "), None), "info");
        // RUST_LOG is other programs' too: one box cannot read is passed over.
        assert_eq!(chosen(None, None, Some("[")), "info");
    }

    #[test]
    fn a_box_log_that_is_not_a_filter_is_refused_naming_it() {
        let refused = log_filter(None, Some("info,box=loud"), None, "info")
            .unwrap_err()
            .to_string();
        assert!(
            refused.starts_with("BOX_LOG=info,box=loud: not a log filter"),
            "{refused}"
        );
        assert!(refused.contains("BOX_LOG=debug"), "{refused}");
    }
}
