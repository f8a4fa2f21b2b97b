//! bash runs real bash: output, exit, timeouts, cancel, groups, bounds, env.

use std::ffi::OsString;
use std::sync::Arc;
use std::time::Instant;

use serde_json::json;

use super::*;
use crate::stamp::StampKey;
use crate::workspace::Workspace;

/// A context over a fresh temporary root, with `env` scrubbed as the executor
/// scrubs its own environment.
pub(crate) fn context_with(env: &[(&str, &str)]) -> (tempfile::TempDir, Arc<Context>) {
    let temp = tempfile::tempdir().unwrap();
    let mut vars: Vec<(OsString, OsString)> =
        vec![("PATH".into(), std::env::var_os("PATH").unwrap_or_default())];
    vars.extend(env.iter().map(|(name, value)| (name.into(), value.into())));
    let scrubbed = box_scrub::scrub_environment(vars, &[]);
    let context = Context {
        workspace: Arc::new(Workspace::open(temp.path()).unwrap()),
        child_env: Arc::new(scrubbed.kept),
        stamp: StampKey::random(),
        max_read_bytes: 2 * 1024 * 1024,
        bash_output: crate::BashOutput::Escape,
    };
    (temp, Arc::new(context))
}

async fn bash(context: &Arc<Context>, arguments: serde_json::Value) -> ToolOutcome {
    let arguments = arguments.as_object().unwrap().clone();
    call(context, &arguments, None, CancellationToken::new()).await
}

async fn line(command: &str) -> ToolOutcome {
    let (_temp, context) = context_with(&[]);
    bash(&context, json!({"command": command})).await
}

#[tokio::test]
async fn output_is_interleaved_and_ends_with_the_exit() {
    let outcome = line("echo a; echo b >&2; echo c").await;
    assert_eq!(outcome, ToolOutcome::ok("a\nb\nc\n[exit 0]"));
}

#[tokio::test]
async fn a_non_zero_exit_fails_but_stderr_alone_does_not() {
    let outcome = line("printf x; exit 3").await;
    assert_eq!(outcome.text, "x\n[exit 3]");
    assert!(outcome.failed && !outcome.is_error);
    let outcome = line("echo oops >&2").await;
    assert_eq!(outcome, ToolOutcome::ok("oops\n[exit 0]"));
    assert_eq!(line("true").await.text, "[exit 0]");
}

#[tokio::test]
async fn runs_at_the_root_without_stdin() {
    let (temp, context) = context_with(&[]);
    let outcome = bash(&context, json!({"command": "pwd; cat; echo done"})).await;
    let root = temp.path().canonicalize().unwrap();
    assert_eq!(outcome.text, format!("{}\ndone\n[exit 0]", root.display()));
}

#[tokio::test]
async fn a_timeout_kills_the_whole_group() {
    let (temp, context) = context_with(&[]);
    let started = Instant::now();
    let outcome = bash(
        &context,
        json!({"command": "sleep 30 & echo $! > grandchild; echo started; sleep 30", "timeout_seconds": 1}),
    )
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(outcome.text, "started\n[killed after 1s]");
    assert!(outcome.failed);
    let pid: i32 = std::fs::read_to_string(temp.path().join("grandchild"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_gone(pid).await;
}

/// The process is gone (or a zombie waiting for its reaper).
pub(crate) async fn assert_gone(pid: i32) {
    for _ in 0..100 {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => return,
            Ok(stat)
                if stat
                    .rsplit(')')
                    .next()
                    .is_some_and(|rest| rest.trim_start().starts_with('Z')) =>
            {
                return;
            }
            Ok(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    panic!("process {pid} is still running");
}

#[tokio::test]
async fn cancel_kills_the_group() {
    let (_temp, context) = context_with(&[]);
    let cancel = CancellationToken::new();
    let trigger = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        trigger.cancel();
    });
    let started = Instant::now();
    let arguments = json!({"command": "echo up; sleep 30"})
        .as_object()
        .unwrap()
        .clone();
    let outcome = call(&context, &arguments, None, cancel).await;
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(outcome.text, "up\n[canceled]");
    assert!(outcome.failed);
}

#[tokio::test]
async fn a_background_process_does_not_hold_the_call() {
    let started = Instant::now();
    let outcome = line("sleep 30 & echo bye").await;
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(outcome.text, "bye\n[exit 0]");
}

#[tokio::test]
async fn output_past_50_kib_is_counted() {
    let outcome = line("head -c 100000 /dev/zero | tr '\\0' a").await;
    let expected = format!(
        "{}\n... [truncated, {} bytes omitted]\n[exit 0]",
        "a".repeat(MAX_OUTPUT_BYTES),
        100_000 - MAX_OUTPUT_BYTES
    );
    assert_eq!(outcome.text, expected);
}

#[tokio::test]
async fn a_flood_does_not_grow_memory() {
    let before = peak_rss_kib();
    let outcome = line("head -c 1000000000 /dev/zero; echo").await;
    let omitted = 1_000_000_001 - MAX_OUTPUT_BYTES as u64;
    assert!(
        outcome
            .text
            .ends_with(&format!("[truncated, {omitted} bytes omitted]\n[exit 0]")),
        "{}",
        &outcome.text[outcome.text.len() - 80..]
    );
    let grown = peak_rss_kib().saturating_sub(before);
    assert!(grown < 32 * 1024, "peak memory grew by {grown} KiB");
}

fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[tokio::test]
async fn invalid_utf8_is_replaced() {
    let outcome = line("printf 'a\\377\\376b'").await;
    assert_eq!(outcome.text, "a\u{fffd}\u{fffd}b\n[exit 0]");
}

#[tokio::test]
async fn progress_carries_output_since_the_last_report() {
    let (_temp, context) = context_with(&[]);
    let (sender, mut receiver) = tokio::sync::mpsc::channel(16);
    let arguments = json!({"command": "echo one; sleep 0.7; echo two"})
        .as_object()
        .unwrap()
        .clone();
    let outcome = call(&context, &arguments, Some(sender), CancellationToken::new()).await;
    assert_eq!(outcome.text, "one\ntwo\n[exit 0]");
    let mut reports = Vec::new();
    while let Ok(report) = receiver.try_recv() {
        reports.push(report);
    }
    assert_eq!(
        reports.first().map(String::as_str),
        Some("one\n"),
        "{reports:?}"
    );
    assert!(reports.iter().all(|report| report.len() <= PROGRESS_BYTES));
}

#[test]
fn progress_keeps_only_the_tail() {
    let mut output = Output::default();
    output.push(&vec![b'a'; 10_000]);
    output.push(b"end");
    assert_eq!(output.pending.len(), PROGRESS_BYTES);
    assert!(output.pending.ends_with(b"aend"));
}

#[tokio::test]
async fn children_never_see_scrubbed_canaries() {
    let (_temp, context) = context_with(&[
        ("GITHUB_TOKEN", "canary-value-1"),
        ("AWS_SECRET_ACCESS_KEY", "canary-value-2"),
        ("LD_PRELOAD", "/canary/evil.so"),
        ("SSH_AUTH_SOCK", "/canary/agent.sock"),
        ("HARMLESS_NAME", "https://u:canary-value-3@example.com"),
        ("BOX_CONTROL", "kept"),
        ("CONTROL_VARIABLE", "benign"),
    ]);
    let outcome = bash(
        &context,
        json!({"command": "env; cat /proc/self/environ | tr '\\0' '\\n'"}),
    )
    .await;
    for canary in [
        "canary",
        "GITHUB_TOKEN",
        "AWS_SECRET",
        "LD_PRELOAD",
        "SSH_AUTH_SOCK",
        "HARMLESS_NAME",
    ] {
        assert!(
            !outcome.text.contains(canary),
            "{canary} reached the child:\n{}",
            outcome.text
        );
    }
    assert!(outcome.text.contains("CONTROL_VARIABLE=benign"));
    assert!(outcome.text.contains("GIT_CONFIG_KEY_0=core.fsmonitor"));
    assert!(outcome.text.contains("GIT_TERMINAL_PROMPT=0"));
}

#[tokio::test]
async fn a_stamp_that_does_not_verify_never_runs() {
    let (temp, context) = context_with(&[]);
    let outcome = bash(&context, json!({"command": "touch ran", "dax_stamp": "00"})).await;
    assert_eq!(outcome, ToolOutcome::error(CHANGED));
    assert!(!temp.path().join("ran").exists());
    let outcome = bash(&context, json!({"command": "touch ran", "dax_stamp": 5})).await;
    assert_eq!(outcome, ToolOutcome::error(CHANGED));
}

#[test]
fn timeouts_default_and_bound() {
    let check = |value: serde_json::Value| {
        let arguments = json!({"timeout_seconds": value})
            .as_object()
            .unwrap()
            .clone();
        timeout_from(&arguments).map(|timeout| timeout.as_secs())
    };
    assert_eq!(timeout_from(&Map::new()), Ok(Duration::from_secs(120)));
    assert_eq!(check(json!(5)), Ok(5));
    assert_eq!(check(json!(0)), Ok(120));
    assert_eq!(check(json!(-3)), Ok(120));
    assert_eq!(check(json!(1e12)), Ok(MAX_TIMEOUT_SECS));
    assert_eq!(check(json!(5.0)), Ok(5));
    assert_eq!(check(json!(-2.0)), Ok(120));
    assert!(check(json!(1.5)).is_err());
    assert!(check(json!("5")).is_err());
}

#[test]
fn durations_are_in_go_format() {
    for (seconds, text) in [
        (120, "2m0s"),
        (5, "5s"),
        (90, "1m30s"),
        (3600, "1h0m0s"),
        (0, "0s"),
    ] {
        assert_eq!(go_duration(Duration::from_secs(seconds)), text);
    }
}

#[test]
fn userinfo_is_redacted() {
    assert_eq!(
        redact_userinfo("remote https://me:tok@host/x and ssh://git@h/y"),
        "remote https://***@host/x and ssh://***@h/y"
    );
}

#[tokio::test]
async fn a_dropped_call_kills_the_group() {
    let (temp, context) = context_with(&[]);
    let arguments = json!({"command": "sleep 30 & echo $! > grandchild; sleep 30"})
        .as_object()
        .unwrap()
        .clone();
    let call = call(&context, &arguments, None, CancellationToken::new());
    assert!(
        tokio::time::timeout(Duration::from_millis(500), call)
            .await
            .is_err()
    );
    let pid: i32 = std::fs::read_to_string(temp.path().join("grandchild"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_gone(pid).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stamped_run_works_on_a_multi_threaded_runtime() {
    let (temp, context) = context_with(&[]);
    std::fs::write(temp.path().join("notes.txt"), "hi\n").unwrap();
    let arguments = json!({"command": "cat notes.txt"})
        .as_object()
        .unwrap()
        .clone();
    let rewrite = facts(&context, &arguments).unwrap().rewrite.unwrap();
    let outcome = call(&context, &rewrite, None, CancellationToken::new()).await;
    assert_eq!(outcome, ToolOutcome::ok("hi\n[exit 0]"));
}

#[test]
fn a_stamped_path_skips_what_the_workspace_can_plant() {
    let root = Path::new("/work/ws");
    let env = vec![(
        OsString::from("PATH"),
        OsString::from("/usr/bin::bin:./x:/work/ws/node_modules/.bin:/bin"),
    )];
    assert_eq!(stamped_path(&env, root).as_deref(), Some("/usr/bin:/bin"));
    assert_eq!(stamped_path(&[], root), None);
}

#[tokio::test]
async fn a_stamped_run_does_not_find_commands_in_the_workspace() {
    let (temp, mut context) = context_with(&[]);
    let bin = temp.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::fs::write(bin.join("cat"), "#!/bin/sh\ntouch PLANTED\n").unwrap();
    let mut permissions = std::fs::metadata(bin.join("cat")).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
    std::fs::set_permissions(bin.join("cat"), permissions).unwrap();
    std::fs::write(temp.path().join("notes.txt"), "hi\n").unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    Arc::get_mut(&mut context).unwrap().child_env = Arc::new(vec![("PATH".into(), path.into())]);
    let arguments = json!({"command": "cat notes.txt"})
        .as_object()
        .unwrap()
        .clone();
    let rewrite = facts(&context, &arguments).unwrap().rewrite.unwrap();
    let outcome = call(&context, &rewrite, None, CancellationToken::new()).await;
    assert_eq!(outcome, ToolOutcome::ok("hi\n[exit 0]"));
    assert!(!temp.path().join("PLANTED").exists());
}

#[test]
fn a_missing_bash_is_said_as_such_with_what_still_works() {
    let missing = std::io::Error::from(std::io::ErrorKind::NotFound);
    let said = start_failed("bash", Path::new("/workspace"), &missing);
    assert!(said.contains("this unit's image has no bash"), "{said}");
    assert!(said.contains("read, write, edit, glob, grep, ls"), "{said}");
    // Another failure keeps the OS's words and where it was tried.
    let denied = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
    let said = start_failed("/bin/bash", Path::new("/workspace"), &denied);
    assert!(
        said.starts_with("bash: cannot start /bin/bash in /workspace"),
        "{said}"
    );
}
