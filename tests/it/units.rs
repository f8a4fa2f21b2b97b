//! `box units` against units a real `box serve` started, on docker and on
//! the local backend: the table read back by its columns, `--filter`,
//! `inspect` by an id prefix (issue 22, item 11).

use std::process::Output;
use std::time::Duration;

use serde_json::Value;

use crate::support::{Served, box_bin, docker_answers, serve_command};

/// `box units ARGS`.
fn units(args: &[&str]) -> Output {
    std::process::Command::new(box_bin())
        .arg("units")
        .args(args)
        .output()
        .unwrap()
}

fn stdout_of(output: &Output) -> String {
    assert!(
        output.status.success(),
        "{output:?}\nstderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone()).unwrap()
}

/// A table as `docker ps` prints it, read back by where each header starts:
/// one map of header to cell per line.
fn read_table(text: &str) -> Vec<std::collections::BTreeMap<String, String>> {
    let mut lines = text.lines();
    let header = lines.next().unwrap_or_default();
    let mut starts: Vec<(usize, &str)> = Vec::new();
    let mut at = 0;
    for name in header.split_whitespace() {
        let start = at + header[at..].find(name).unwrap();
        starts.push((start, name));
        at = start + name.len();
    }
    lines
        .map(|line| {
            starts
                .iter()
                .enumerate()
                .map(|(index, (start, name))| {
                    let end = starts.get(index + 1).map_or(line.len(), |next| next.0);
                    let cell = line.get(*start..end.min(line.len())).unwrap_or_default();
                    // A cell that ran into the next column's start would not
                    // be whitespace-terminated.
                    if index + 1 < starts.len() {
                        assert!(
                            line[..end.min(line.len())].ends_with(' '),
                            "column {name} overflows in {line:?}"
                        );
                    }
                    ((*name).to_owned(), cell.trim().to_owned())
                })
                .collect()
        })
        .collect()
}

async fn listed_read_back_filtered_and_inspected(backend: &str) {
    let instance = format!("units-{backend}-{}", std::process::id());
    let workspace = tempfile::tempdir().unwrap();
    let served = Served::start(serve_command(backend, &instance, workspace.path()));
    let envelope = served.initialized["result"]["capabilities"]["experimental"]
        ["io.github.christopherdavenport.dax/executor"]["box"]["units"][0]
        .clone();
    let id = envelope["id"].as_str().unwrap().to_owned();
    // Never a pid: a local unit's id is as long and as random as docker's are.
    assert!(id.len() >= 32, "{id}");
    assert!(id.parse::<u64>().is_err(), "{id} looks like a pid");

    let filter = format!("instance={instance}");
    let listed: Value =
        serde_json::from_str(&stdout_of(&units(&["ls", "--json", "--filter", &filter]))).unwrap();
    let listed = listed.as_array().unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    let session = listed[0]["session"].as_str().unwrap().to_owned();
    assert_eq!(listed[0]["id"], id.as_str());

    // The table, read back by its columns: the session id whole (32
    // characters, longer than the column used to be), nothing shifted.
    let table = stdout_of(&units(&["ls", "--filter", &filter]));
    let rows = read_table(&table);
    assert_eq!(rows.len(), 1, "{table}");
    let row = &rows[0];
    assert_eq!(row["ID"], id[..12], "{table}");
    assert_eq!(row["BACKEND"], backend, "{table}");
    assert_eq!(row["INSTANCE"], instance, "{table}");
    assert_eq!(row["SESSION"], session, "{table}");
    assert_eq!(row["UNIT"], "workspace", "{table}");
    assert_eq!(row["PROFILE"], "default", "{table}");
    assert_eq!(row["STATE"], "running", "{table}");
    let want_image = match backend {
        "docker" => envelope["image"].as_str().unwrap(),
        _ => "-",
    };
    assert_eq!(row["IMAGE"], want_image, "{table}");
    let age = &row["AGE"];
    assert!(
        age.ends_with(['s', 'm']) && age[..age.len() - 1].parse::<u64>().is_ok(),
        "{table}"
    );

    // Filters: keys all match, values of one key are alternatives.
    let session_filter = format!("session={session}");
    let count = |args: &[&str]| -> usize {
        let mut all = vec!["ls", "--json"];
        all.extend_from_slice(args);
        let listed: Value = serde_json::from_str(&stdout_of(&units(&all))).unwrap();
        listed.as_array().unwrap().len()
    };
    assert_eq!(count(&["--filter", &session_filter]), 1);
    let backend_filter = format!("backend={backend}");
    assert_eq!(
        count(&[
            "--filter",
            &session_filter,
            "--filter",
            &backend_filter,
            "--filter",
            "profile=default"
        ]),
        1
    );
    assert_eq!(
        count(&["--filter", &session_filter, "--filter", "profile=nonesuch"]),
        0
    );
    assert_eq!(
        count(&[
            "--filter",
            &session_filter,
            "--filter",
            "profile=nonesuch",
            "--filter",
            "profile=default"
        ]),
        1
    );
    let other = if backend == "docker" {
        "backend=local"
    } else {
        "backend=docker"
    };
    assert_eq!(count(&["--filter", &session_filter, "--filter", other]), 0);
    // Nothing matches: the header alone.
    let empty = stdout_of(&units(&["ls", "--filter", "session=nonesuch"]));
    assert!(read_table(&empty).is_empty(), "{empty}");

    // Inspect by a prefix: image, workspace, limits and the envelope.
    let shown = stdout_of(&units(&["inspect", &id[..8]]));
    for line in [
        format!("id:        {id}"),
        format!("backend:   {backend}"),
        format!("session:   {session}"),
        "limits:    memory 2GiB".to_owned(),
        "envelope (as reported at its start):".to_owned(),
        format!("  id: {id}"),
    ] {
        assert!(shown.contains(&line), "no {line:?} in\n{shown}");
    }
    let workspace_line = format!("workspace: {}", workspace.path().display());
    assert!(shown.contains(&workspace_line), "{shown}");
    let image_line = match backend {
        "docker" => format!("image:     {want_image}"),
        _ => "image:     none: the host's own userland".to_owned(),
    };
    assert!(shown.contains(&image_line), "{shown}");
    for debug in ["Some(", "None", "{\""] {
        assert!(!shown.contains(debug), "{debug} in\n{shown}");
    }
    let json: Value =
        serde_json::from_str(&stdout_of(&units(&["inspect", "--json", &id[..8]]))).unwrap();
    assert_eq!(json["id"], id.as_str());
    assert_eq!(json["host"], "alive");
    assert_eq!(json["backend"], backend);
    assert_eq!(
        json["workspace"],
        workspace.path().display().to_string().as_str()
    );
    assert!(json["pid"].as_u64().is_some_and(|pid| pid > 1), "{json}");
    assert_eq!(json["envelope"]["id"], id.as_str(), "{json}");
    assert_eq!(
        json["envelope"]["limits"]["memoryBytes"], envelope["limits"]["memoryBytes"],
        "{json}"
    );

    served.hang_up();
    // Gone with its session: inspect says so.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let out = units(&["inspect", &id]);
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                stderr.contains("no box unit has an id starting"),
                "{stderr}"
            );
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "unit {id} outlived its session"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn local_units_read_back_by_column_filtered_and_inspected_by_prefix() {
    listed_read_back_filtered_and_inspected("local").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn docker_units_read_back_by_column_filtered_and_inspected_by_prefix() {
    if !docker_answers().await {
        return;
    }
    listed_read_back_filtered_and_inspected("docker").await;
}

/// An unknown filter key is a usage error naming the known ones; so is a
/// backend that is not one.
#[test]
fn an_unknown_filter_is_refused_naming_the_known_keys() {
    for (filter, want) in [
        (
            "colour=red",
            "unknown key `colour`; known keys: backend, instance, profile, session",
        ),
        ("session", "write KEY=VALUE"),
        ("backend=kube", "no backend `kube`; choose docker or local"),
        ("profile=", "`profile=` has no value"),
    ] {
        let out = units(&["ls", "--filter", filter]);
        assert_eq!(out.status.code(), Some(2), "{filter}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(want), "{filter}: {stderr}");
    }
}
