//! `box units top` and the usage columns of `box units ls`: what each
//! running unit uses, as its backend reads it ([`Backend::stats`]: the
//! unit's cgroup; a local unit's processes). A figure a backend cannot read
//! is shown `-` (and left out of `--json`).

use std::collections::HashMap;
use std::io::IsTerminal as _;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use box_backend::Backend;
use box_backend::stats::UnitStats;

use super::units::{Listed, UnitFilter, runtime, shown, units_of};

/// How often `box units top` refreshes.
const REFRESH: Duration = Duration::from_secs(1);

/// Each running unit's usage, in `units`' order (`None`: not running, or
/// its backend reports none).
pub(super) async fn usage(
    backends: &[Arc<dyn Backend>],
    units: &[Listed],
) -> Vec<Option<UnitStats>> {
    let reads = units.iter().map(|(of, unit)| async move {
        if unit.state != "running" {
            return None;
        }
        backends[*of].stats(&unit.id).await.ok()
    });
    futures::future::join_all(reads).await
}

/// `usage`'s figures added to a unit's JSON (the known ones).
pub(super) fn add_usage(shown: &mut serde_json::Value, usage: Option<&UnitStats>) {
    if let (Some(object), Some(Ok(serde_json::Value::Object(figures)))) =
        (shown.as_object_mut(), usage.map(serde_json::to_value))
    {
        object.extend(figures.into_iter().filter(|(_, value)| !value.is_null()));
    }
}

/// CPU time for people: `0.42s`, `3m04s`, `2h05m`; empty when unknown.
pub(super) fn cpu_time(usec: Option<u64>) -> String {
    let Some(usec) = usec else {
        return String::new();
    };
    let secs = usec / 1_000_000;
    match secs {
        0..60 => format!("{:.2}s", usec as f64 / 1e6),
        60..3600 => format!("{}m{:02}s", secs / 60, secs % 60),
        _ => format!("{}h{:02}m", secs / 3600, secs % 3600 / 60),
    }
}

/// Bytes for people, in binary units: `512B`, `64.0MiB`; empty when unknown.
pub(super) fn bytes(bytes: Option<u64>) -> String {
    let Some(bytes) = bytes else {
        return String::new();
    };
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < units.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes}B")
    } else {
        format!("{value:.1}{}", units[unit])
    }
}

/// `box units top`'s columns.
const COLUMNS: [&str; 11] = [
    "ID", "BACKEND", "SESSION", "UNIT", "CPU%", "CPU", "MEM", "PEAK", "PIDS", "READ", "WRITE",
];

/// One frame: a unit's cells; its CPU share from the previous frame's
/// reading (`before`: CPU time and when), else `-`.
fn frame_row(
    backend: &str,
    (_, unit): &Listed,
    usage: Option<&UnitStats>,
    before: Option<(u64, Instant)>,
    now: Instant,
) -> Vec<String> {
    let usage = usage.cloned().unwrap_or_default();
    let share = before
        .zip(usage.cpu_usec)
        .and_then(|((then, at), cpu)| {
            let elapsed = now.duration_since(at).as_micros();
            (elapsed > 0).then(|| {
                format!(
                    "{:.1}",
                    cpu.saturating_sub(then) as f64 * 100.0 / elapsed as f64
                )
            })
        })
        .unwrap_or_default();
    vec![
        unit.id.get(..12).unwrap_or(&unit.id).to_owned(),
        backend.to_owned(),
        unit.session.get(..12).unwrap_or(&unit.session).to_owned(),
        unit.unit.clone(),
        share,
        cpu_time(usage.cpu_usec),
        bytes(usage.memory_bytes),
        bytes(usage.memory_peak_bytes),
        usage.pids.map(|pids| pids.to_string()).unwrap_or_default(),
        bytes(usage.io_read_bytes),
        bytes(usage.io_write_bytes),
    ]
}

/// `rows` under `COLUMNS`, each column as wide as its widest cell, an empty
/// cell shown `-`.
fn render(rows: &[Vec<String>]) -> String {
    let lines: Vec<Vec<String>> = std::iter::once(COLUMNS.map(str::to_owned).to_vec())
        .chain(rows.iter().cloned())
        .map(|row| {
            row.into_iter()
                .map(|cell| {
                    if cell.is_empty() {
                        "-".to_owned()
                    } else {
                        cell.chars().filter(|c| !c.is_control()).collect()
                    }
                })
                .collect()
        })
        .collect();
    super::out::columns(&lines)
}

/// Run `box units top`: a frame every second until interrupted, or one
/// (`once`; as JSON with `json`).
pub(super) fn top(
    only: Option<box_backend::BackendKind>,
    filters: &[UnitFilter],
    once: bool,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let runtime = runtime()?;
    let terminal = std::io::stdout().is_terminal();
    let mut before: HashMap<String, (u64, Instant)> = HashMap::new();
    loop {
        let (backends, units, usage) = runtime.block_on(async {
            let (backends, units) = units_of(only, filters).await?;
            let usage = usage(&backends, &units).await;
            anyhow::Ok((backends, units, usage))
        })?;
        let now = Instant::now();
        let running: Vec<(&Listed, &Option<UnitStats>)> = units
            .iter()
            .zip(&usage)
            .filter(|((_, unit), _)| unit.state == "running")
            .collect();
        if json {
            let shown = running
                .iter()
                .map(|(listed, usage)| {
                    let mut shown = shown(&backends, listed)?;
                    add_usage(&mut shown, usage.as_ref());
                    Ok(shown)
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            outln!("{}", serde_json::to_string_pretty(&shown)?);
            return Ok(ExitCode::SUCCESS);
        }
        let rows: Vec<Vec<String>> = running
            .iter()
            .map(|(listed, usage)| {
                let backend = backends[listed.0].kind();
                frame_row(
                    backend.as_str(),
                    listed,
                    usage.as_ref(),
                    before.get(&listed.1.id).copied(),
                    now,
                )
            })
            .collect();
        if terminal && !once {
            // Home and clear: each frame replaces the last.
            out!("\x1b[H\x1b[2J");
        }
        out!("{}", render(&rows));
        if once {
            return Ok(ExitCode::SUCCESS);
        }
        before = running
            .iter()
            .filter_map(|((_, unit), usage)| {
                Some((unit.id.clone(), (usage.as_ref()?.cpu_usec?, now)))
            })
            .collect();
        std::thread::sleep(REFRESH);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_are_written_for_people_and_unknown_is_empty() {
        assert_eq!(cpu_time(Some(420_000)), "0.42s");
        assert_eq!(cpu_time(Some(184_000_000)), "3m04s");
        assert_eq!(cpu_time(Some(7_500_000_000)), "2h05m");
        assert_eq!(cpu_time(None), "");
        assert_eq!(bytes(Some(512)), "512B");
        assert_eq!(bytes(Some(64 << 20)), "64.0MiB");
        assert_eq!(bytes(Some(3 << 30)), "3.0GiB");
        assert_eq!(bytes(None), "");
    }

    #[test]
    fn json_has_the_known_figures_only() {
        let mut shown = serde_json::json!({"id": "a"});
        add_usage(
            &mut shown,
            Some(&UnitStats {
                cpu_usec: Some(5),
                memory_bytes: Some(6),
                ..UnitStats::default()
            }),
        );
        assert_eq!(
            shown,
            serde_json::json!({"id": "a", "cpuUsec": 5, "memoryBytes": 6})
        );
    }
}
