//! Benchmarks for fork and merge (BENCHMARKS.md, "Fork and merge"):
//!
//! - `fork`: forking a generated 10,000-file git repository in copy mode and
//!   in worktree mode (dirty overlay on, so `git status` runs), against
//!   `cp -a --reflink=auto` of the same tree run as a process, interleaved
//!   round by round;
//! - `merge`: merging a 100-file change (modified, added, deleted, some
//!   binary) from a worktree child, against `git diff --binary HEAD | git
//!   apply` between the same child and a copy of the parent, run directly.
//!
//! `cargo bench -p box-fork --bench fork [fork|merge]`; `BOX_FORK_BENCH_DIR`
//! picks the filesystem (default: the temporary directory),
//! `BOX_FORK_BENCH_ROUNDS` the rounds (default 9), `BOX_FORK_BENCH_FILES`
//! the tree size (default 10,000).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use box_fork::{Base, Git, MergeOptions, Mode, Options, fork, merge};

fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

fn median(samples: &[Duration]) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    sorted.get(sorted.len() / 2).copied().unwrap_or_default()
}

fn fastest(samples: &[Duration]) -> Duration {
    samples.iter().copied().min().unwrap_or_default()
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

/// A deterministic generator for file sizes and bytes.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }
}

fn git_env(command: &mut Command) -> &mut Command {
    command
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", "/nonexistent")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
}

fn git(dir: &Path, args: &[&str]) {
    let status = git_env(Command::new("git").arg("-C").arg(dir))
        .args([
            "-c",
            "user.name=bench",
            "-c",
            "user.email=bench@example.invalid",
            "-c",
            "gc.auto=0",
        ])
        .args(args)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "git {args:?} in {}", dir.display());
}

/// A repository of `files` text files (100 B to 8 KiB) in 2 levels of
/// directories, committed and packed.
fn generate(dir: &Path, files: usize) {
    fs::create_dir_all(dir).unwrap();
    git(dir, &["init", "-q", "-b", "main"]);
    let mut random = Lcg(42);
    for index in 0..files {
        let path = dir.join(format!(
            "d{:03}/{}f{index:05}.txt",
            index / 100,
            if index % 2 == 1 { "sub/" } else { "" }
        ));
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        let size = 100 + (random.next() % 8000) as usize;
        let line = format!("line of file {index} with some text to fill it up\n");
        fs::write(&path, line.repeat(size / line.len() + 1)).unwrap();
    }
    fs::write(dir.join(".gitignore"), "/target\n").unwrap();
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", "generated"]);
    git(dir, &["repack", "-adq"]);
    // A repository in use has a refreshed index: wait out git's racy-clean
    // second, then let it record every file's stat.
    std::thread::sleep(Duration::from_millis(1100));
    git(dir, &["update-index", "-q", "--really-refresh"]);
}

fn neutral_git() -> Git {
    Git::new([
        ("PATH", "/usr/local/bin:/usr/bin:/bin"),
        ("HOME", "/nonexistent"),
        ("GIT_CONFIG_NOSYSTEM", "1"),
        ("GIT_CONFIG_GLOBAL", "/dev/null"),
        ("GIT_CONFIG_COUNT", "3"),
        ("GIT_CONFIG_KEY_0", "core.hooksPath"),
        ("GIT_CONFIG_VALUE_0", "/dev/null"),
        ("GIT_CONFIG_KEY_1", "core.fsmonitor"),
        ("GIT_CONFIG_VALUE_1", "false"),
        ("GIT_CONFIG_KEY_2", "safe.bareRepository"),
        ("GIT_CONFIG_VALUE_2", "explicit"),
    ])
}

/// CPU time used so far by this process and its waited-for children.
fn cpu_time() -> Duration {
    let mut total = Duration::ZERO;
    for who in [libc::RUSAGE_SELF, libc::RUSAGE_CHILDREN] {
        // SAFETY: getrusage fills the zeroed struct it is given.
        let usage = unsafe {
            let mut usage: libc::rusage = std::mem::zeroed();
            libc::getrusage(who, &mut usage);
            usage
        };
        for time in [usage.ru_utime, usage.ru_stime] {
            total += Duration::from_secs(time.tv_sec as u64)
                + Duration::from_micros(time.tv_usec as u64);
        }
    }
    total
}

/// Wall-clock and CPU time (this process and the children it waited for).
#[derive(Clone, Copy, Default)]
struct Sample {
    wall: Duration,
    cpu: Duration,
}

fn timed<T>(work: impl FnOnce() -> T) -> (Sample, T) {
    let cpu = cpu_time();
    let start = Instant::now();
    let value = work();
    (
        Sample {
            wall: start.elapsed(),
            cpu: cpu_time().saturating_sub(cpu),
        },
        value,
    )
}

/// `median ms (fastest) / CPU median ms`.
fn cell(samples: &[Sample]) -> String {
    let walls: Vec<Duration> = samples.iter().map(|sample| sample.wall).collect();
    let cpus: Vec<Duration> = samples.iter().map(|sample| sample.cpu).collect();
    format!(
        "{:.0} ms ({:.0}), CPU {:.0} ms",
        ms(median(&walls)),
        ms(fastest(&walls)),
        ms(median(&cpus))
    )
}

/// Ratios of the wall medians and of the fastest rounds, then of CPU.
fn ratio(ours: &[Sample], baseline: &[Sample]) -> String {
    let wall = |samples: &[Sample]| samples.iter().map(|sample| sample.wall).collect::<Vec<_>>();
    let cpu = |samples: &[Sample]| samples.iter().map(|sample| sample.cpu).collect::<Vec<_>>();
    format!(
        "{:.2} ({:.2}), CPU {:.2}",
        ms(median(&wall(ours))) / ms(median(&wall(baseline))),
        ms(fastest(&wall(ours))) / ms(fastest(&wall(baseline))),
        ms(median(&cpu(ours))) / ms(median(&cpu(baseline))),
    )
}

fn remove(path: &Path) {
    if path.exists() {
        fs::remove_dir_all(path).unwrap();
    }
}

fn bench_fork(scratch: &Path, parent: &Path, rounds: usize, files: usize) {
    let git_runner = neutral_git();
    let (mut cp, mut copy, mut worktree, mut git_worktree) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let target = scratch.join("target");
    let mut copy_shares = String::new();
    for round in 0..=rounds {
        remove(&target);
        let (elapsed, status) = timed(|| {
            Command::new("cp")
                .arg("-a")
                .arg("--reflink=auto")
                .arg(parent)
                .arg(&target)
                .status()
                .unwrap()
        });
        assert!(status.success());
        remove(&target);
        let (elapsed_copy, forked) = timed(|| {
            fork(
                &git_runner,
                parent,
                &target,
                &Options {
                    mode: Mode::Copy,
                    ..Options::default()
                },
            )
            .unwrap()
        });
        assert_eq!(forked.base.len(), files + 1);
        copy_shares = forked.shares;
        remove(&target);
        let (elapsed_worktree, forked) =
            timed(|| fork(&git_runner, parent, &target, &Options::default()).unwrap());
        assert!(forked.advisory.is_none());
        box_fork::discard(&git_runner, &target, &forked.base).unwrap();
        // Seed 002's mechanism, for reference: a linked worktree, which
        // shares refs, config and hooks with the parent.
        let (elapsed_git_worktree, ()) = timed(|| {
            let status = git_env(Command::new("git").arg("-C").arg(parent))
                .args([
                    "-c",
                    "core.hooksPath=/dev/null",
                    "worktree",
                    "add",
                    "-q",
                    "--detach",
                ])
                .arg(&target)
                .arg("HEAD")
                .status()
                .unwrap();
            assert!(status.success());
        });
        git(
            parent,
            &[
                "worktree",
                "remove",
                "--force",
                &target.display().to_string(),
            ],
        );
        // Round 0 warms the page cache and is not counted.
        if round > 0 {
            cp.push(elapsed);
            copy.push(elapsed_copy);
            worktree.push(elapsed_worktree);
            git_worktree.push(elapsed_git_worktree);
        }
    }
    println!(
        "fork of a {files}-file repository, {rounds} rounds: wall median (fastest), CPU median; copy mode shares: {copy_shares}"
    );
    println!("| figure | box-fork | `cp -a --reflink=auto`, same run | ratio |");
    println!("|---|---|---|---|");
    for (name, samples) in [
        ("copy mode", &copy),
        ("worktree mode (dirty overlay on)", &worktree),
    ] {
        println!(
            "| {name} | {} | {} | {} |",
            cell(samples),
            cell(&cp),
            ratio(samples, &cp)
        );
    }
    println!("| figure | box-fork | `git worktree add --detach` (seed 002), same run | ratio |");
    println!("|---|---|---|---|");
    println!(
        "| worktree mode (dirty overlay on) | {} | {} | {} |",
        cell(&worktree),
        cell(&git_worktree),
        ratio(&worktree, &git_worktree)
    );
}

/// Change 100 files of the child: 60 modified (10 of them to binary), 20
/// added, 20 deleted.
fn change_100(child: &Path) {
    let mut random = Lcg(7);
    let mut entries: Vec<PathBuf> = Vec::new();
    for dir in 0..100 {
        entries.push(child.join(format!("d{dir:03}/f{:05}.txt", dir * 100)));
    }
    for (index, path) in entries.iter().enumerate().take(60) {
        if index < 10 {
            let bytes: Vec<u8> = (0..4096).map(|_| random.next() as u8).collect();
            fs::write(path, bytes).unwrap();
        } else {
            let mut text = fs::read_to_string(path).unwrap();
            text.insert_str(text.len() / 2, "a line inserted by the child\n");
            fs::write(path, text).unwrap();
        }
    }
    for index in 0..20 {
        fs::write(
            child.join(format!("d{index:03}/added-{index}.txt")),
            format!("added file {index}\n"),
        )
        .unwrap();
    }
    for path in &entries[60..80] {
        fs::remove_file(path).unwrap();
    }
}

fn reset(repository: &Path) {
    git(repository, &["checkout", "-q", "--", "."]);
    git(repository, &["clean", "-fdq"]);
}

fn bench_merge(scratch: &Path, parent: &Path, rounds: usize) {
    let git_runner = neutral_git();
    let child = scratch.join("merge-child");
    let other = scratch.join("merge-other-parent");
    remove(&child);
    remove(&other);
    let status = Command::new("cp")
        .arg("-a")
        .arg(parent)
        .arg(&other)
        .status()
        .unwrap();
    assert!(status.success());
    let forked = fork(&git_runner, parent, &child, &Options::default()).unwrap();
    change_100(&child);
    // So `git diff` sees the added files too (not timed).
    git(&child, &["add", "-N", "."]);
    let locks = scratch.join("locks");
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for round in 0..=rounds {
        reset(&other);
        let (elapsed_git, ()) = timed(|| {
            let mut diff = git_env(Command::new("git").arg("-C").arg(&child))
                .args(["diff", "--binary", "HEAD"])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let apply = git_env(Command::new("git").arg("-C").arg(&other))
                .arg("apply")
                .stdin(diff.stdout.take().unwrap())
                .status()
                .unwrap();
            assert!(diff.wait().unwrap().success() && apply.success());
        });
        reset(parent);
        let mut base: Base = forked.base.clone();
        let (elapsed_merge, merged) =
            timed(|| merge(&child, parent, &mut base, &MergeOptions::default(), &locks).unwrap());
        assert_eq!(
            merged.merged.len() + merged.deleted.len(),
            100,
            "{merged:?}"
        );
        if round > 0 {
            ours.push(elapsed_merge);
            theirs.push(elapsed_git);
        }
    }
    reset(parent);
    box_fork::discard(&git_runner, &child, &forked.base).unwrap();
    remove(&other);
    println!(
        "merge of a 100-file change (60 modified, 10 of them binary; 20 added; 20 deleted), {rounds} rounds: wall median (fastest), CPU median"
    );
    println!("| figure | box-fork | `git diff --binary HEAD \\| git apply`, same run | ratio |");
    println!("|---|---|---|---|");
    println!(
        "| merge | {} | {} | {} |",
        cell(&ours),
        cell(&theirs),
        ratio(&ours, &theirs)
    );
}

fn main() {
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|arg| !arg.starts_with("--"))
        .collect();
    let wanted = |name: &str| filter.is_empty() || filter.iter().any(|arg| arg == name);
    let rounds = env_number("BOX_FORK_BENCH_ROUNDS", 9);
    let files = env_number("BOX_FORK_BENCH_FILES", 10_000);
    let root =
        std::env::var_os("BOX_FORK_BENCH_DIR").map_or_else(std::env::temp_dir, PathBuf::from);
    let scratch = tempfile::Builder::new()
        .prefix("box-fork-bench")
        .tempdir_in(&root)
        .unwrap();
    let parent = scratch.path().join("parent");
    let (elapsed, ()) = timed(|| generate(&parent, files));
    println!(
        "generated {files} files in {:.1} s under {} ({})",
        elapsed.wall.as_secs_f64(),
        root.display(),
        String::from_utf8_lossy(
            &Command::new("git")
                .arg("--version")
                .output()
                .unwrap()
                .stdout
        )
        .trim()
    );
    if wanted("fork") {
        bench_fork(scratch.path(), &parent, rounds, files);
    }
    if wanted("merge") {
        bench_merge(scratch.path(), &parent, rounds);
    }
}
