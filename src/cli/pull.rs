//! `box image pull IMAGE` and the pull progress `box run` shows: one updating
//! line on a terminal (layers and bytes), plain lines when stderr is not a
//! terminal or NO_COLOR is set, JSON lines for scripts (`--json`).

use std::io::{IsTerminal as _, Write as _};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use box_backend_docker::{PullEvent, PullSink, PullTally};

/// How pull progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// One line, redrawn in place (stderr).
    Line,
    /// A line per layer step worth saying (stderr).
    Plain,
    /// A JSON object per event (stdout).
    Json,
}

impl Style {
    /// The style for stderr: an updating line on a terminal, else plain lines.
    pub fn for_stderr() -> Self {
        if std::io::stderr().is_terminal() && !crate::cli::no_color() {
            Style::Line
        } else {
            Style::Plain
        }
    }
}

/// The least time between two redraws of the updating line.
const REDRAW: Duration = Duration::from_millis(100);

struct View {
    style: Style,
    tally: PullTally,
    image: String,
    drawn: Option<Instant>,
    /// The updating line is on screen (a newline ends it).
    open: bool,
}

/// A pull's progress shown in `style`; [`Progress::sink`] hands it to the backend.
#[derive(Clone)]
pub struct Progress {
    view: Arc<Mutex<View>>,
}

impl Progress {
    /// Progress shown in `style`.
    pub fn new(style: Style) -> Self {
        Self {
            view: Arc::new(Mutex::new(View {
                style,
                tally: PullTally::default(),
                image: String::new(),
                drawn: None,
                open: false,
            })),
        }
    }

    /// The sink the backend reports to.
    pub fn sink(&self) -> PullSink {
        let view = Arc::clone(&self.view);
        Arc::new(move |event: &PullEvent| {
            if let Ok(mut view) = view.lock() {
                view.show(event);
            }
        })
    }

    /// End the updating line, if one is on screen.
    pub fn finish(&self) {
        if let Ok(mut view) = self.view.lock()
            && view.open
        {
            view.draw();
            eprintln!();
            view.open = false;
        }
    }
}

impl View {
    fn show(&mut self, event: &PullEvent) {
        if self.image != event.image {
            // Another image (box run's units pull one after another or at once).
            if self.open {
                eprintln!();
                self.open = false;
            }
            self.image = event.image.clone();
            self.tally = PullTally::default();
        }
        self.tally.add(event);
        match self.style {
            Style::Json => {
                let line = serde_json::json!({
                    "image": event.image,
                    "layer": event.layer,
                    "status": event.status,
                    "current": event.current,
                    "total": event.total,
                });
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "{line}");
            }
            Style::Plain => {
                if let Some(line) = plain_line(event) {
                    eprintln!("{line}");
                }
            }
            // The pull's last word: the updating line is done.
            Style::Line if event.layer.is_none() && event.status.starts_with("Status:") => {
                self.draw();
                eprintln!();
                self.open = false;
            }
            Style::Line => {
                let due = self.drawn.is_none_or(|at| at.elapsed() >= REDRAW);
                let step = !matches!(event.status.as_str(), "Downloading" | "Extracting");
                if due || step {
                    self.draw();
                }
            }
        }
    }

    fn draw(&mut self) {
        let summary = self.tally.summary();
        let mut line = format!(
            "pulling {}: {}/{} layers",
            self.image, summary.done, summary.layers
        );
        if summary.existed > 0 {
            line.push_str(&format!(" ({} already here)", summary.existed));
        }
        if summary.to_download > 0 {
            line.push_str(&format!(
                ", {} of {}",
                mib(summary.downloaded),
                mib(summary.to_download)
            ));
        }
        if summary.extracting {
            line.push_str(", extracting");
        }
        let mut err = std::io::stderr().lock();
        // Back to the line's start and clear it: the line is redrawn in place.
        let _ = write!(err, "\r\x1b[2K{line}");
        let _ = err.flush();
        self.drawn = Some(Instant::now());
        self.open = true;
    }
}

fn mib(bytes: u64) -> String {
    // Display only: the precision lost converting to f64 is far below a 0.1 MiB digit.
    #[allow(clippy::cast_precision_loss)]
    let mib = bytes as f64 / f64::from(1u32 << 20);
    format!("{mib:.1} MiB")
}

/// A plain line for an event worth a line of its own (not every byte count).
fn plain_line(event: &PullEvent) -> Option<String> {
    let status = event.status.as_str();
    match (&event.layer, status) {
        (_, "Downloading" | "Extracting" | "Waiting" | "Verifying Checksum") => None,
        (Some(_), _) if status.starts_with("Pulling from") => {
            Some(format!("pulling {}", event.image))
        }
        (Some(layer), _) => Some(format!("  layer {layer}: {status}")),
        (None, _) if status.is_empty() => None,
        (None, _) => Some(format!("  {status}")),
    }
}

/// `box image pull`: put an image on the engine from its registry.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = "Examples:
  box image pull python:3.12-slim
  box image pull localhost:5000/tools@sha256:<64 hex digits>
  box image pull --json ghcr.io/org/tool:v1 | tail -1
  REGISTRY_AUTH=ci:token box image pull --pull-secret REGISTRY_AUTH registry.internal/app:v1

Credentials come from the Docker config file (`docker login`), or with
--pull-secret VAR from box's environment variable VAR (user:password, as a
profile's pull_secret names it); never printed.
A pinned image (NAME@sha256:..., or NAME:TAG@sha256:... to check the tag too)
is verified to be that content.")]
pub struct PullArgs {
    /// The image: NAME[:TAG][@sha256:DIGEST].
    #[arg(value_name = "IMAGE")]
    pub image: String,
    /// Print JSON lines on stdout: each progress event, then the result
    /// (`{"image", "id", "digest", "downloaded", "seconds"}`).
    #[arg(long)]
    pub json: bool,
    /// The environment variable holding the registry's `user:password`
    /// (instead of the Docker config file's credentials).
    #[arg(long, value_name = "VAR")]
    pub pull_secret: Option<String>,
}

/// Run `box image pull`.
pub fn pull(args: &PullArgs) -> anyhow::Result<ExitCode> {
    let style = if args.json {
        Style::Json
    } else {
        Style::for_stderr()
    };
    let progress = Progress::new(style);
    let sink = progress.sink();
    let started = Instant::now();
    if box_backend_docker::pull::is_box_image(&args.image) {
        anyhow::bail!(
            "{} is one of box's own images, which are in no registry: {}",
            args.image,
            box_backend_docker::missing_image_remedy(&args.image, crate::plan::PullPolicy::Missing)
        );
    }
    let result = crate::cli::units::runtime()?.block_on(async {
        let puller = box_backend_docker::Puller::connect()
            .await
            .map_err(|why| anyhow::anyhow!("docker: {why}"))?;
        puller
            .pull_image(&args.image, Some(&sink), args.pull_secret.as_deref())
            .await
            .map_err(anyhow::Error::from)
    });
    progress.finish();
    let pulled = result?;
    let seconds = started.elapsed().as_secs_f64();
    if args.json {
        outln!(
            "{}",
            serde_json::json!({
                "image": pulled.image,
                "id": pulled.id,
                "digest": pulled.digest,
                "downloaded": pulled.downloaded,
                "seconds": seconds,
            })
        );
    } else {
        let what = if pulled.downloaded {
            "pulled"
        } else {
            "up to date"
        };
        let digest = pulled
            .digest
            .as_deref()
            .map(|digest| format!(" digest {digest}"))
            .unwrap_or_default();
        eprintln!("{what} {} in {seconds:.1}s", pulled.image);
        outln!("{} id {}{digest}", pulled.image, pulled.id);
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(layer: Option<&str>, status: &str, total: Option<u64>) -> PullEvent {
        PullEvent {
            image: "img".to_owned(),
            layer: layer.map(str::to_owned),
            status: status.to_owned(),
            current: None,
            total,
        }
    }

    #[test]
    fn plain_lines_say_each_step_but_not_each_byte() {
        assert_eq!(
            plain_line(&event(Some("ab12"), "Downloading", Some(10))),
            None
        );
        assert_eq!(
            plain_line(&event(Some("1.0"), "Pulling from img", None)).as_deref(),
            Some("pulling img")
        );
        assert_eq!(
            plain_line(&event(Some("ab12"), "Pull complete", None)).as_deref(),
            Some("  layer ab12: Pull complete")
        );
        assert_eq!(
            plain_line(&event(None, "Digest: sha256:1", None)).as_deref(),
            Some("  Digest: sha256:1")
        );
        assert_eq!(mib(100 << 20), "100.0 MiB");
    }
}
