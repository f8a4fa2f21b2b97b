//! The process methods against real processes.

use std::time::Instant;

use pretty_assertions::assert_eq;

use super::*;
use crate::bash::tests::{assert_gone, context_with};

fn processes(env: &[(&str, &str)]) -> (tempfile::TempDir, Processes) {
    let (temp, context) = context_with(env);
    (temp, Processes::new(context))
}

async fn call(processes: &Processes, op: &str, params: Value) -> Result<Value, String> {
    processes
        .handle(op, params)
        .await
        .map_err(|problem| problem.0)
}

async fn start(processes: &Processes, params: Value) -> String {
    let result = call(processes, "start", params).await.unwrap();
    result["id"].as_str().unwrap().to_owned()
}

/// Read `fd` until end of file.
async fn read_all(processes: &Processes, id: &str, fd: i64) -> Vec<u8> {
    let mut all = Vec::new();
    loop {
        let result = call(processes, "read", json!({"id": id, "fd": fd}))
            .await
            .unwrap();
        if let Some(data) = result.get("data") {
            all.extend(BASE64.decode(data.as_str().unwrap()).unwrap());
        }
        if result.get("eof") == Some(&json!(true)) {
            return all;
        }
    }
}

#[tokio::test]
async fn a_round_trip_through_cat() {
    let (_temp, processes) = processes(&[]);
    let id = start(&processes, json!({"args": ["cat"]})).await;
    assert_eq!(id, "p1");
    let written = call(
        &processes,
        "write",
        json!({"id": id, "data": BASE64.encode("hello\n")}),
    )
    .await;
    assert_eq!(written, Ok(json!({})));
    let read = call(&processes, "read", json!({"id": id, "fd": 1, "max": 3})).await;
    assert_eq!(read, Ok(json!({"data": BASE64.encode("hel")})));
    let read = call(&processes, "read", json!({"id": id, "fd": 1})).await;
    assert_eq!(read, Ok(json!({"data": BASE64.encode("lo\n")})));
    assert_eq!(
        call(&processes, "closeStdin", json!({"id": id})).await,
        Ok(json!({}))
    );
    assert_eq!(read_all(&processes, &id, 1).await, b"");
    assert_eq!(
        call(&processes, "wait", json!({"id": id})).await,
        Ok(json!({"status": 0}))
    );
    assert_eq!(
        call(&processes, "signal", json!({"id": id, "signal": "TERM"})).await,
        Ok(json!({"done": true}))
    );
    assert_eq!(
        call(&processes, "close", json!({"id": id})).await,
        Ok(json!({"status": 0}))
    );
    assert_eq!(
        call(&processes, "wait", json!({"id": id})).await,
        Err("no such process in this session".to_owned())
    );
    assert_eq!(start(&processes, json!({"args": ["true"]})).await, "p2");
}

#[tokio::test]
async fn start_checks_its_params() {
    let (_temp, processes) = processes(&[]);
    for (params, message) in [
        (json!({"args": []}), "no command"),
        (json!({"args": [""]}), "no command"),
        (
            json!({"args": ["true"], "timeoutMs": -1}),
            "a negative timeout",
        ),
        (
            json!({"args": ["true"], "env": ["NOEQUALS"]}),
            "env entry \"NOEQUALS\" is not NAME=value",
        ),
        (
            json!({"args": ["true"], "env": ["=x"]}),
            "env entry \"=x\" is not NAME=value",
        ),
    ] {
        assert_eq!(
            call(&processes, "start", params).await,
            Err(message.to_owned())
        );
    }
    let missing = call(
        &processes,
        "start",
        json!({"args": ["/nonexistent/program"]}),
    )
    .await;
    assert!(
        missing
            .unwrap_err()
            .starts_with("start /nonexistent/program: ")
    );
    assert!(
        call(&processes, "start", json!({"dir": 5}))
            .await
            .unwrap_err()
            .contains("invalid params")
    );
    assert!(
        call(&processes, "bogus", json!({}))
            .await
            .unwrap_err()
            .starts_with("unknown process method")
    );
}

#[tokio::test]
async fn at_most_32_are_open() {
    let (_temp, processes) = processes(&[]);
    let mut ids = Vec::new();
    for _ in 0..MAX_PROCESSES {
        ids.push(start(&processes, json!({"args": ["sleep", "30"]})).await);
    }
    assert_eq!(
        call(&processes, "start", json!({"args": ["true"]})).await,
        Err(
            "32 processes are open in this session, the most there may be; close one first"
                .to_owned()
        )
    );
    call(
        &processes,
        "signal",
        json!({"id": ids[0], "signal": "KILL"}),
    )
    .await
    .unwrap();
    let closed = call(&processes, "close", json!({"id": ids[0]}))
        .await
        .unwrap();
    assert_eq!(closed, json!({"status": -1}));
    assert_eq!(start(&processes, json!({"args": ["true"]})).await, "p33");
    processes.shutdown().await;
}

#[tokio::test]
async fn writes_and_reads_are_bounded() {
    let (_temp, processes) = processes(&[]);
    let id = start(&processes, json!({"args": ["cat"]})).await;
    let big = BASE64.encode(vec![0_u8; MAX_WRITE_BYTES + 1]);
    assert_eq!(
        call(&processes, "write", json!({"id": id, "data": big})).await,
        Err("a write of 1048577 bytes; at most 1048576".to_owned())
    );
    assert_eq!(
        call(&processes, "read", json!({"id": id, "fd": 3})).await,
        Err("fd 3: only 1 (stdout) or 2 (stderr) can be read".to_owned())
    );
    assert_eq!(
        call(&processes, "read", json!({"id": id, "fd": 2})).await,
        Err("fd 2: the process was started without stderr: true".to_owned())
    );
    assert_eq!(
        call(&processes, "signal", json!({"id": id, "signal": "HUP"})).await,
        Err("unknown signal \"HUP\"; use INT, TERM or KILL".to_owned())
    );
    // A full write is accepted, and a read returns at most 64 KiB whatever max asks.
    let exact = BASE64.encode(vec![b'x'; MAX_WRITE_BYTES]);
    let writer = async { call(&processes, "write", json!({"id": id, "data": exact})).await };
    let reader = async {
        let mut total = 0;
        while total < MAX_WRITE_BYTES {
            let result = call(&processes, "read", json!({"id": id, "fd": 1, "max": 0}))
                .await
                .unwrap();
            let data = BASE64.decode(result["data"].as_str().unwrap()).unwrap();
            assert!(data.len() <= MAX_READ_BYTES);
            total += data.len();
        }
        total
    };
    let (written, total) = tokio::join!(writer, reader);
    assert_eq!(written, Ok(json!({})));
    assert_eq!(total, MAX_WRITE_BYTES);
    processes.shutdown().await;
}

#[tokio::test]
async fn stdout_waits_for_reads_and_stderr_drops_past_64_kib() {
    let (temp, processes) = processes(&[]);
    let id = start(
        &processes,
        json!({"args": ["sh", "-c", "head -c 100000 /dev/zero >&2; head -c 200000 /dev/zero; touch finished"], "stderr": true}),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    // 64 KiB buffered plus a pipe's worth: the writer is blocked.
    assert!(!temp.path().join("finished").exists());
    assert_eq!(read_all(&processes, &id, 1).await.len(), 200_000);
    assert_eq!(
        call(&processes, "wait", json!({"id": id})).await,
        Ok(json!({"status": 0}))
    );
    assert!(temp.path().join("finished").exists());
    let closed = call(&processes, "close", json!({"id": id})).await.unwrap();
    let stderr = BASE64.decode(closed["stderr"].as_str().unwrap()).unwrap();
    assert_eq!(stderr.len(), MAX_READ_BYTES);
}

#[tokio::test]
async fn stderr_is_readable_when_asked_for() {
    let (_temp, processes) = processes(&[]);
    let id = start(
        &processes,
        json!({"args": ["sh", "-c", "echo out; echo err >&2"], "stderr": true}),
    )
    .await;
    assert_eq!(read_all(&processes, &id, 2).await, b"err\n");
    assert_eq!(read_all(&processes, &id, 1).await, b"out\n");
    assert_eq!(
        call(&processes, "close", json!({"id": id})).await,
        Ok(json!({"status": 0}))
    );
}

#[tokio::test]
async fn a_timeout_ends_the_group() {
    let (_temp, processes) = processes(&[]);
    let started = Instant::now();
    let id = start(
        &processes,
        json!({"args": ["sh", "-c", "sleep 30 & echo $!; wait"], "timeoutMs": 300}),
    )
    .await;
    let grandchild = grandchild_pid(&processes, &id).await;
    assert_eq!(
        call(&processes, "wait", json!({"id": id})).await,
        Ok(json!({"status": -1, "ended": "timeout"}))
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_gone(grandchild).await;
}

async fn grandchild_pid(processes: &Processes, id: &str) -> i32 {
    let result = call(processes, "read", json!({"id": id, "fd": 1}))
        .await
        .unwrap();
    let line = BASE64.decode(result["data"].as_str().unwrap()).unwrap();
    String::from_utf8(line).unwrap().trim().parse().unwrap()
}

#[tokio::test]
async fn close_ends_the_whole_group() {
    let (_temp, processes) = processes(&[]);
    let id = start(
        &processes,
        json!({"args": ["sh", "-c", "sleep 30 & echo $!; wait"]}),
    )
    .await;
    let grandchild = grandchild_pid(&processes, &id).await;
    let started = Instant::now();
    // sh ignores stdin, so close goes on to SIGTERM after the 2 s grace.
    let closed = call(&processes, "close", json!({"id": id})).await.unwrap();
    assert_eq!(closed, json!({"status": -1}));
    assert!(started.elapsed() < Duration::from_secs(4));
    assert_gone(grandchild).await;
}

#[tokio::test]
async fn a_signal_reaches_the_group() {
    let (_temp, processes) = processes(&[]);
    let id = start(&processes, json!({"args": ["sleep", "30"]})).await;
    assert_eq!(
        call(&processes, "signal", json!({"id": id, "signal": "INT"})).await,
        Ok(json!({}))
    );
    assert_eq!(
        call(&processes, "wait", json!({"id": id})).await,
        Ok(json!({"status": -1}))
    );
}

#[tokio::test]
async fn shutdown_ends_everything_and_refuses_starts() {
    let (_temp, processes) = processes(&[]);
    let id = start(
        &processes,
        json!({"args": ["sh", "-c", "sleep 30 & echo $!; wait"]}),
    )
    .await;
    let grandchild = grandchild_pid(&processes, &id).await;
    processes.shutdown().await;
    assert_gone(grandchild).await;
    assert_eq!(
        call(&processes, "start", json!({"args": ["true"]})).await,
        Err("the executor is stopping".to_owned())
    );
}

#[tokio::test]
async fn the_environment_is_scrubbed_plus_the_entries() {
    let (_temp, processes) = processes(&[
        ("GITHUB_TOKEN", "canary-value"),
        ("CONTROL_VARIABLE", "benign"),
    ]);
    let id = start(&processes, json!({"args": ["env"], "env": ["EXTRA=a=b"]})).await;
    let output = String::from_utf8(read_all(&processes, &id, 1).await).unwrap();
    assert!(output.contains("EXTRA=a=b\n"), "{output}");
    assert!(output.contains("CONTROL_VARIABLE=benign\n"), "{output}");
    assert!(
        !output.contains("canary") && !output.contains("GITHUB_TOKEN"),
        "{output}"
    );
}

#[tokio::test]
async fn a_process_starts_at_the_root() {
    let (temp, processes) = processes(&[]);
    let id = start(&processes, json!({"args": ["pwd"], "dir": ""})).await;
    let output = String::from_utf8(read_all(&processes, &id, 1).await).unwrap();
    assert_eq!(
        output.trim(),
        temp.path().canonicalize().unwrap().display().to_string()
    );
}

#[tokio::test]
async fn a_dropped_table_leaves_nothing_running() {
    let (_temp, processes) = processes(&[]);
    let id = start(
        &processes,
        json!({"args": ["sh", "-c", "sleep 30 & echo $!; wait"]}),
    )
    .await;
    let grandchild = grandchild_pid(&processes, &id).await;
    drop(processes);
    assert_gone(grandchild).await;
}

#[tokio::test]
async fn close_stops_a_pump_nobody_reads() {
    let (_temp, processes) = processes(&[]);
    let id = start(
        &processes,
        json!({"args": ["sh", "-c", "head -c 200000 /dev/zero"]}),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let process = processes.get(&id).unwrap();
    let stdout = Arc::downgrade(&process.stdout);
    drop(process);
    call(&processes, "close", json!({"id": id})).await.unwrap();
    // The pump task let go of the stream: nothing is left holding it.
    for _ in 0..100 {
        if stdout.upgrade().is_none() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the stdout pump is still running after close");
}

#[tokio::test]
async fn a_process_starts_in_a_directory_inside() {
    let (temp, processes) = processes(&[]);
    std::fs::create_dir(temp.path().join("sub")).unwrap();
    std::os::unix::fs::symlink("/etc", temp.path().join("out")).unwrap();
    let result = call(&processes, "start", json!({"args": ["pwd"], "dir": "sub"}))
        .await
        .unwrap();
    let id = result["id"].as_str().unwrap().to_owned();
    let output = String::from_utf8(read_all(&processes, &id, 1).await).unwrap();
    let sub = temp.path().canonicalize().unwrap().join("sub");
    assert_eq!(output.trim(), sub.display().to_string());
    let refused = call(&processes, "start", json!({"args": ["pwd"], "dir": "out"})).await;
    assert!(refused.unwrap_err().starts_with("dir: "));
    let refused = call(&processes, "start", json!({"args": ["pwd"], "dir": "/etc"})).await;
    assert!(refused.unwrap_err().starts_with("dir: "));
}

/// Read `fd` until the output so far contains `wanted` (or end of file).
async fn read_until(processes: &Processes, id: &str, wanted: &str) -> String {
    let mut all = Vec::new();
    loop {
        let result = call(processes, "read", json!({"id": id, "fd": 1}))
            .await
            .unwrap();
        if let Some(data) = result.get("data") {
            all.extend(BASE64.decode(data.as_str().unwrap()).unwrap());
        }
        let text = String::from_utf8_lossy(&all).into_owned();
        if text.contains(wanted) || result.get("eof") == Some(&json!(true)) {
            return text;
        }
    }
}

/// `text` written to the process's stdin (typed, on a terminal).
async fn type_in(processes: &Processes, id: &str, text: &str) {
    call(
        processes,
        "write",
        json!({"id": id, "data": BASE64.encode(text)}),
    )
    .await
    .unwrap();
}

/// closeStdin, then all the process prints until its stdout ends (`None`
/// when that takes over 10 s).
async fn close_stdin_and_drain(processes: &Processes, id: &str) -> Option<Vec<u8>> {
    call(processes, "closeStdin", json!({"id": id}))
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), read_all(processes, id, 1))
        .await
        .ok()
}

/// The process ends with status 0, and is closed.
async fn ends_with_status_0(processes: &Processes, id: &str) {
    assert_eq!(
        call(processes, "wait", json!({"id": id})).await,
        Ok(json!({"status": 0}))
    );
    call(processes, "close", json!({"id": id})).await.unwrap();
}

/// box's extension: `tty: {rows, cols}` gives the process a terminal of its
/// own (a controlling one, of the size asked), which `box/process.resize`
/// resizes; input typed at it arrives, and closeStdin types ^D.
#[tokio::test]
async fn a_process_with_a_terminal_sees_it_and_its_size() {
    let (_temp, processes) = processes(&[]);
    let script = "tty; stty size; read line; echo got:$line; stty size; \
                  (: > /dev/tty) 2>/dev/null && echo controlling-tty; \
                  cat; echo cat-ended";
    let id = start(
        &processes,
        json!({"args": ["sh", "-c", script], "stderr": true, "tty": {"rows": 24, "cols": 80}}),
    )
    .await;
    let first = tokio::time::timeout(
        Duration::from_secs(10),
        read_until(&processes, &id, "24 80"),
    )
    .await
    .unwrap();
    assert!(first.contains("/dev/pts/"), "{first:?}");
    assert!(first.contains("24 80"), "{first:?}");
    assert_eq!(
        processes
            .resize(json!({"id": id, "rows": 40, "cols": 100}))
            .map_err(|problem| problem.0),
        Ok(json!({}))
    );
    type_in(&processes, &id, "hello\n").await;
    let second = tokio::time::timeout(
        Duration::from_secs(10),
        read_until(&processes, &id, "40 100"),
    )
    .await
    .unwrap();
    assert!(second.contains("got:hello"), "{second:?}");
    assert!(second.contains("40 100"), "{second:?}");
    let second = if second.contains("controlling-tty") {
        second
    } else {
        second + &read_until(&processes, &id, "controlling-tty").await
    };
    assert!(second.contains("controlling-tty"), "{second:?}");
    // Standard error is the terminal too: fd 2 has nothing of its own.
    assert_eq!(
        call(&processes, "read", json!({"id": id, "fd": 2})).await,
        Ok(json!({"eof": true}))
    );
    // closeStdin types ^D: `cat` sees end of file and the script ends.
    let rest = close_stdin_and_drain(&processes, &id).await.unwrap();
    assert!(
        String::from_utf8_lossy(&rest).contains("cat-ended"),
        "{rest:?}"
    );
    ends_with_status_0(&processes, &id).await;
}

/// Issue 22, item 9: input and closeStdin sent before the process has taken
/// its terminal out of line mode (as bash's line editor does once it starts)
/// still end it: the end of file reaches it as the key, not as the NUL a
/// key typed in line mode and read out of it becomes.
#[tokio::test]
async fn closing_a_terminal_s_stdin_reaches_a_program_that_left_line_mode() {
    let (_temp, processes) = processes(&[]);
    // Reads key by key out of line mode, as a line editor does, and ends on ^D.
    let script = "sleep 0.5; stty -icanon -echo min 1; \
                  while :; do key=$(dd bs=1 count=1 2>/dev/null | od -An -tx1 | tr -d ' \\n'); \
                  echo \"key:$key\"; [ \"$key\" = 04 ] && exit 0; \
                  [ -z \"$key\" ] && exit 3; done";
    let id = start(
        &processes,
        json!({"args": ["sh", "-c", script], "tty": {"rows": 24, "cols": 80}}),
    )
    .await;
    type_in(&processes, &id, "x\n").await;
    let output = close_stdin_and_drain(&processes, &id)
        .await
        .expect("the program never read an end of file");
    let output = String::from_utf8_lossy(&output);
    assert!(output.contains("key:78"), "{output:?}");
    assert!(output.contains("key:04"), "{output:?}");
    assert!(!output.contains("key:00"), "{output:?}");
    ends_with_status_0(&processes, &id).await;
}

/// Issue 22, item 9: a last line without its newline, then closeStdin, ends
/// `cat` on a terminal (the first ^D hands the partial line over, the
/// second is the end of file).
#[tokio::test]
async fn closing_a_terminal_s_stdin_after_a_partial_line_ends_cat() {
    let (_temp, processes) = processes(&[]);
    let id = start(
        &processes,
        json!({"args": ["cat"], "tty": {"rows": 24, "cols": 80}}),
    )
    .await;
    type_in(&processes, &id, "partial").await;
    let output = close_stdin_and_drain(&processes, &id)
        .await
        .expect("cat never read an end of file");
    // The terminal's echo, then cat's copy.
    assert_eq!(String::from_utf8_lossy(&output), "partialpartial");
    ends_with_status_0(&processes, &id).await;
}

/// A process without a terminal cannot be resized; the error says how to get one.
#[tokio::test]
async fn resizing_a_process_without_a_terminal_is_refused() {
    let (_temp, processes) = processes(&[]);
    let id = start(&processes, json!({"args": ["sleep", "5"]})).await;
    let refused = processes
        .resize(json!({"id": id, "rows": 40, "cols": 100}))
        .map_err(|problem| problem.0);
    assert!(
        refused
            .as_ref()
            .is_err_and(|why| why.contains("tty: {rows, cols}")),
        "{refused:?}"
    );
    call(&processes, "close", json!({"id": id})).await.unwrap();
}
