//! Benchmarks for the units area: see BENCHMARKS.md for what each figure means and
//! how to reproduce it (`cargo bench --bench units`).
//!
//! Docker part: every figure is a ratio against raw bollard calls on the same
//! image, measured in the same run (the machine is shared and noisy), plus the
//! absolute median.

// A benchmark stops on the first failure, loudly.
#![allow(clippy::expect_used, clippy::unwrap_used)]

#[path = "common/mod.rs"]
mod common;

use common::{median, ms};

use std::time::{Duration, Instant};

use boxhost::backend::docker::DockerBackend;
use boxhost::backend::docker::bollard::Docker;
use boxhost::backend::docker::bollard::models::{ContainerCreateBody, HostConfig};
use boxhost::backend::docker::bollard::query_parameters::RemoveContainerOptionsBuilder;
use boxhost::backend::{Backend, SessionLabel};
use boxhost::plan::{Limits, Requirement, Security, UnitSpec, UserIds, WorkspaceSource};
use futures::StreamExt;
use tokio::io::AsyncReadExt;

const IMAGE: &str = "box-base:bookworm";
const ROUNDS: usize = 9;

fn spec(workspace: &std::path::Path) -> UnitSpec {
    UnitSpec {
        user: Some(UserIds {
            uid: 1000,
            gid: 1000,
        }),
        limits: Limits {
            memory_bytes: 512 << 20,
            cpus: 1.0,
            pids: 256,
            tmp_bytes: 64 << 20,
            home_bytes: 64 << 20,
            nofile: 1024,
            call_timeout: Duration::from_secs(60),
            idle: Duration::from_secs(600),
            lifetime: Duration::from_secs(3600),
            // The rest (the start deadline) as a shipped profile has them.
            ..Limits::default()
        },
        security: Security {
            landlock: Requirement::BestEffort,
            ..Security::strict()
        },
        ..UnitSpec::workspace(IMAGE, WorkspaceSource::Host(workspace.to_path_buf()))
    }
}

async fn raw_remove(docker: &Docker, id: &str) {
    let _ = docker
        .remove_container(
            id,
            Some(RemoveContainerOptionsBuilder::new().force(true).build()),
        )
        .await;
}

/// Raw baseline: create + start a container of the same image running `true`
/// under the init, and wait for it to exit.
async fn raw_true(docker: &Docker, label: &str) -> (Duration, String) {
    let started = Instant::now();
    let id = docker
        .create_container(
            None,
            ContainerCreateBody {
                image: Some(IMAGE.to_owned()),
                cmd: Some(vec!["true".to_owned()]),
                labels: Some([("box.bench".to_owned(), label.to_owned())].into()),
                host_config: Some(HostConfig {
                    init: Some(true),
                    network_mode: Some("none".to_owned()),
                    ..Default::default()
                }),
                ..Default::default()
            },
        )
        .await
        .expect("raw create")
        .id;
    docker.start_container(&id, None).await.expect("raw start");
    let _ = docker.wait_container(&id, None).next().await;
    (started.elapsed(), id)
}

/// Raw baseline for idle memory and removal: a running `sleep infinity`.
async fn raw_idle(docker: &Docker, label: &str) -> String {
    let id = docker
        .create_container(
            None,
            ContainerCreateBody {
                image: Some(IMAGE.to_owned()),
                cmd: Some(vec!["sleep".to_owned(), "infinity".to_owned()]),
                labels: Some([("box.bench".to_owned(), label.to_owned())].into()),
                host_config: Some(HostConfig {
                    init: Some(true),
                    network_mode: Some("none".to_owned()),
                    ..Default::default()
                }),
                ..Default::default()
            },
        )
        .await
        .expect("raw create")
        .id;
    docker.start_container(&id, None).await.expect("raw start");
    id
}

/// The container's cgroup memory in bytes (v2 or v1, cgroupfs or systemd driver).
fn cgroup_memory(id: &str) -> Option<u64> {
    [
        format!("/sys/fs/cgroup/system.slice/docker-{id}.scope/memory.current"),
        format!("/sys/fs/cgroup/docker/{id}/memory.current"),
        format!("/sys/fs/cgroup/memory/docker/{id}/memory.usage_in_bytes"),
        format!("/sys/fs/cgroup/memory/system.slice/docker-{id}.scope/memory.usage_in_bytes"),
    ]
    .iter()
    .find_map(|p| std::fs::read_to_string(p).ok())
    .and_then(|s| s.trim().parse().ok())
}

/// Resident set of the container's processes whose command line mentions `name`.
async fn rss_of(docker: &Docker, id: &str, name: &str) -> u64 {
    let Ok(top) = docker.top_processes(id, None).await else {
        return 0;
    };
    let titles = top.titles.unwrap_or_default();
    let pid_col = titles.iter().position(|t| t == "PID").unwrap_or(1);
    let cmd_col = titles
        .iter()
        .position(|t| t == "CMD")
        .unwrap_or(titles.len().saturating_sub(1));
    let mut total = 0;
    for row in top.processes.unwrap_or_default() {
        let (Some(pid), Some(cmd)) = (row.get(pid_col), row.get(cmd_col)) else {
            continue;
        };
        if !cmd.contains(name) {
            continue;
        }
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        total += status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or(0)
            * 1024;
    }
    total
}

async fn docker_part() {
    let backend = match DockerBackend::connect().await {
        Ok(backend) => backend.with_executor_binary(env!("CARGO_BIN_EXE_box")),
        Err(error) => {
            println!("units/docker: NOT RUN: {error}");
            return;
        }
    };
    if backend.client().inspect_image(IMAGE).await.is_err() {
        println!("units/docker: NOT RUN: image {IMAGE} missing (scripts/images.sh)");
        return;
    }
    let docker = backend.client().clone();
    let label = format!("bench-{}", std::process::id());
    let workspace = tempfile::tempdir().expect("tempdir");
    std::os::unix::fs::chown(workspace.path(), Some(1000), Some(1000)).expect("chown");
    let unit_spec = spec(workspace.path());

    // 1. Start: a unit whose executor is `true`, until its stdout ends (the
    //    exec ran and answered), against raw create+start of `true` until exit.
    let with_true = backend
        .clone()
        .with_executor_command(vec!["true".to_owned()]);
    let mut unit_times = Vec::new();
    let mut raw_times = Vec::new();
    let mut remove_times = Vec::new();
    let mut raw_remove_times = Vec::new();
    for round in 0..ROUNDS {
        let (raw, raw_id) = raw_true(&docker, &label).await;
        raw_times.push(raw);
        raw_remove(&docker, &raw_id).await;

        let session = SessionLabel {
            instance: label.clone(),
            session: format!("s{round}"),
            profile: "bench".to_owned(),
        };
        let started = Instant::now();
        let mut unit = with_true
            .start(&session, &unit_spec)
            .await
            .expect("unit start");
        let mut sink = Vec::new();
        let _ = unit.io.stdout.read_to_end(&mut sink).await;
        unit_times.push(started.elapsed());

        // 2. Removal of a running unit against raw force-remove of a running container.
        let removing = Instant::now();
        backend.remove(&unit.envelope.id).await.expect("remove");
        remove_times.push(removing.elapsed());
        let idle = raw_idle(&docker, &label).await;
        let removing = Instant::now();
        raw_remove(&docker, &idle).await;
        raw_remove_times.push(removing.elapsed());
    }
    let (unit, raw) = (median(&unit_times), median(&raw_times));
    println!(
        "units/docker start→exec answered: {:.0} ms vs raw create+start+exit {:.0} ms = {:.2}x (goal ≤ 1.3x)",
        ms(unit),
        ms(raw),
        unit.as_secs_f64() / raw.as_secs_f64()
    );
    let (remove, raw_rm) = (median(&remove_times), median(&raw_remove_times));
    println!(
        "units/docker stop+remove: {:.0} ms vs raw force remove {:.0} ms = {:.2}x",
        ms(remove),
        ms(raw_rm),
        remove.as_secs_f64() / raw_rm.as_secs_f64()
    );

    // 3. Idle memory: a unit with a long-lived stand-in executor (`cat`, until
    //    the real executor lands) against a raw `sleep infinity` container.
    let with_cat = backend
        .clone()
        .with_executor_command(vec!["cat".to_owned()]);
    let session = SessionLabel {
        instance: label.clone(),
        session: "idle".to_owned(),
        profile: "bench".to_owned(),
    };
    let unit = with_cat
        .start(&session, &unit_spec)
        .await
        .expect("idle unit");
    let raw = raw_idle(&docker, &label).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let unit_mem = cgroup_memory(&unit.envelope.id);
    let raw_mem = cgroup_memory(&raw);
    let executor_rss = rss_of(&docker, &unit.envelope.id, "cat").await;
    match (unit_mem, raw_mem) {
        (Some(u), Some(r)) => println!(
            "units/docker idle memory: cgroup {:.1} MiB (+ executor RSS {:.1} MiB) vs raw {:.1} MiB = {:.2}x",
            u as f64 / 1048576.0,
            executor_rss as f64 / 1048576.0,
            r as f64 / 1048576.0,
            u as f64 / r.max(1) as f64
        ),
        _ => println!("units/docker idle memory: cgroup not readable here"),
    }
    backend
        .remove(&unit.envelope.id)
        .await
        .expect("remove idle");
    raw_remove(&docker, &raw).await;
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(docker_part());
}
