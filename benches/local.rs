//! Benchmarks for the local backend: how much a confined unit start costs
//! against spawning the same command unconfined, in the same run. See
//! BENCHMARKS.md (Units, local lines) for what each figure means and how to
//! reproduce it (`cargo bench --bench local`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "common/mod.rs"]
mod common;

use common::{fastest, median, ms};

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use boxhost::backend::local::{LocalBackend, LocalOptions};
use boxhost::backend::{Backend, Envelope, SessionLabel};
use boxhost::plan::{NetworkMode, Requirement, Security, UnitSpec, WorkspaceSource};

const ROUNDS: usize = 200;

fn unit_spec(workspace: &Path) -> UnitSpec {
    UnitSpec {
        root: workspace.to_path_buf(),
        security: Security {
            landlock: Requirement::BestEffort,
            ..Security::strict()
        },
        ..UnitSpec::workspace("", WorkspaceSource::Host(workspace.to_path_buf()))
    }
}

/// One round of one configuration: start until confined, and the whole cycle.
async fn unit_round(
    backend: &LocalBackend,
    spec: &UnitSpec,
    command: &[OsString],
) -> (Duration, Duration, Envelope) {
    let session = SessionLabel {
        instance: "local-bench".to_owned(),
        session: "bench".to_owned(),
        profile: "bench".to_owned(),
    };
    // A local unit: helper, namespaces, init, rlimits, landlock, capabilities,
    // until the confinement is reported (the command is being executed) ...
    let began = Instant::now();
    let started = backend
        .start_command(&session, spec, command.to_vec())
        .await
        .unwrap();
    let start = began.elapsed();
    // ... and until it has ended and been removed (temp directory included).
    let end = started.ended.await;
    backend.remove(&started.envelope.id).await.unwrap();
    let cycle = began.elapsed();
    assert_eq!(end.exit_code, Some(0), "{}", end.reason);
    (start, cycle, started.envelope)
}

/// Baseline: spawn the same command with no confinement, until it has exited.
/// Also the reference: the same command under util-linux `unshare` with the
/// same namespaces.
async fn baseline_round(command: &[OsString]) -> Duration {
    let began = Instant::now();
    let status = tokio::process::Command::new(&command[0])
        .args(&command[1..])
        .stdout(std::process::Stdio::null())
        .status()
        .await
        .unwrap();
    assert!(status.success());
    began.elapsed()
}

#[tokio::main]
async fn main() {
    let box_exe = PathBuf::from(env!("CARGO_BIN_EXE_box"));
    let workspace = std::env::temp_dir().join(format!("box-local-bench-{}", std::process::id()));
    std::fs::create_dir_all(&workspace).unwrap();
    // The command both sides run: the box binary itself, to completion.
    let command: Vec<OsString> = vec![box_exe.clone().into(), "--version".into()];
    let default_temp = boxhost::backend::local::default_temp_root();
    let tmpfs = PathBuf::from("/dev/shm");
    let configurations = [
        (
            "full, network none",
            Requirement::BestEffort,
            Requirement::Required,
            NetworkMode::None,
            &default_temp,
        ),
        (
            "full, network none, unit temp on tmpfs",
            Requirement::BestEffort,
            Requirement::Required,
            NetworkMode::None,
            &tmpfs,
        ),
        (
            "full, host network",
            Requirement::BestEffort,
            Requirement::Required,
            NetworkMode::Bridge,
            &default_temp,
        ),
        (
            "no namespaces, landlock TCP for network none",
            Requirement::Off,
            Requirement::Required,
            NetworkMode::None,
            &default_temp,
        ),
        (
            "helper only: rlimits, no_new_privs, capabilities",
            Requirement::Off,
            Requirement::Off,
            NetworkMode::Bridge,
            &default_temp,
        ),
    ];
    let units: Vec<(LocalBackend, UnitSpec)> = configurations
        .iter()
        .map(|(_, namespaces, landlock, network, temp_root)| {
            let backend = LocalBackend::with_options(LocalOptions {
                box_exe: box_exe.clone(),
                namespaces: *namespaces,
                landlock_min_abi: 1,
                temp_root: (*temp_root).clone(),
            });
            let mut spec = unit_spec(&workspace);
            spec.security.landlock = *landlock;
            spec.network.mode = *network;
            (backend, spec)
        })
        .collect();
    let unshare: Vec<OsString> = [
        "unshare",
        "--user",
        "--map-current-user",
        "--mount",
        "--ipc",
        "--net",
        "--pid",
        "--fork",
        "--mount-proc",
    ]
    .into_iter()
    .map(OsString::from)
    .chain(command.iter().cloned())
    .collect();
    let has_unshare = std::process::Command::new("unshare")
        .args(&unshare[1..])
        .stdout(std::process::Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    let mut reference = Vec::new();
    let mut baseline = Vec::new();
    let mut starts = vec![Vec::new(); units.len()];
    let mut cycles = vec![Vec::new(); units.len()];
    let mut envelopes = vec![None; units.len()];
    // Rounds interleave every configuration with the baseline, so a noisy
    // neighbour slows them alike.
    for round in 0..ROUNDS + 3 {
        let unconfined = baseline_round(&command).await;
        if round >= 3 {
            baseline.push(unconfined);
        }
        if has_unshare {
            let time = baseline_round(&unshare).await;
            if round >= 3 {
                reference.push(time);
            }
        }
        for (index, (backend, spec)) in units.iter().enumerate() {
            let (start, cycle, envelope) = unit_round(backend, spec, &command).await;
            if round >= 3 {
                starts[index].push(start);
                cycles[index].push(cycle);
            }
            envelopes[index] = Some(envelope);
        }
    }
    std::fs::remove_dir_all(&workspace).unwrap();
    let base = median(&baseline);
    let base_fastest = fastest(&baseline);
    println!(
        "{ROUNDS} interleaved rounds; median (fastest), ratio to the baseline's median (fastest)"
    );
    println!(
        "baseline: unconfined spawn+exit of `box --version`: {:.2} ms ({:.2} ms); unit temp in {}",
        ms(base),
        ms(base_fastest),
        default_temp.display()
    );
    if has_unshare {
        println!(
            "reference: `unshare -U --map-current-user -m -i -n -p -f --mount-proc box --version`: {:.2} ms ({:.2} ms), ratio {:.2} ({:.2})",
            ms(median(&reference)),
            ms(fastest(&reference)),
            ms(median(&reference)) / ms(base),
            ms(fastest(&reference)) / ms(base_fastest)
        );
    }
    println!(
        "| local unit | start until confined | ratio | start+exit+remove | ratio | namespaces | landlock |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (index, (label, ..)) in configurations.iter().enumerate() {
        let envelope = envelopes[index].take().unwrap();
        let (start, cycle) = (&starts[index], &cycles[index]);
        println!(
            "| {label} | {:.2} ({:.2}) ms | {:.2} ({:.2}) | {:.2} ({:.2}) ms | {:.2} ({:.2}) | {} | {} |",
            ms(median(start)),
            ms(fastest(start)),
            ms(median(start)) / ms(base),
            ms(fastest(start)) / ms(base_fastest),
            ms(median(cycle)),
            ms(fastest(cycle)),
            ms(median(cycle)) / ms(base),
            ms(fastest(cycle)) / ms(base_fastest),
            envelope.hardening.namespaces.join(","),
            envelope.hardening.landlock_enforced
        );
    }
}
