use std::os::unix::fs::symlink;

use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use super::*;

fn workspace() -> (tempfile::TempDir, Workspace) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("AGENTS.md"), "hi").unwrap();
    std::fs::write(dir.path().join("empty"), "").unwrap();
    std::fs::create_dir_all(dir.path().join(".dax/skills")).unwrap();
    std::fs::write(dir.path().join(".dax/config.json"), "{}").unwrap();
    symlink("../.env", dir.path().join("dotenv")).unwrap();
    symlink("/etc", dir.path().join("out")).unwrap();
    let workspace = Workspace::open(dir.path()).unwrap();
    (dir, workspace)
}

fn read_json(workspace: &Workspace, uri: &str) -> Value {
    serde_json::from_str(&read(workspace, uri)).unwrap()
}

fn error_kind(document: &Value) -> &str {
    document["error"]["kind"].as_str().unwrap_or("none")
}

#[test]
fn stat_and_lstat_use_go_file_modes() {
    let (_dir, workspace) = workspace();
    let info = read_json(&workspace, "agentworkspace:///stat?path=AGENTS.md");
    assert_eq!(info["info"]["name"], json!("AGENTS.md"));
    assert_eq!(info["info"]["size"], json!(2));
    assert_eq!(info["info"]["mode"].as_u64().unwrap() & !0o777, 0);
    let dir_info = read_json(&workspace, "agentworkspace:///stat?path=.dax");
    assert_eq!(dir_info["info"]["mode"].as_u64().unwrap() >> 31, 1);
    let link = read_json(&workspace, "agentworkspace:///lstat?path=dotenv");
    assert_eq!(link["info"]["mode"].as_u64().unwrap() & (1 << 27), 1 << 27);
}

#[test]
fn read_readlink_and_readdir() {
    let (_dir, workspace) = workspace();
    assert_eq!(
        read_json(&workspace, "agentworkspace:///read?path=.dax%2Fconfig.json"),
        json!({"data": "e30="})
    );
    assert_eq!(
        read_json(&workspace, "agentworkspace:///read?path=empty"),
        json!({})
    );
    assert_eq!(
        read_json(&workspace, "agentworkspace:///readlink?path=dotenv"),
        json!({"target": "../.env"})
    );
    let listing = read_json(&workspace, "agentworkspace:///readdir?path=.");
    let mut names: Vec<&str> = listing["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| entry["name"].as_str().unwrap())
        .collect();
    names.sort_unstable();
    assert_eq!(names, [".dax", "AGENTS.md", "dotenv", "empty", "out"]);
}

#[test]
fn bad_uris_and_names_get_error_kinds() {
    let (_dir, workspace) = workspace();
    let kind = |uri: &str| error_kind(&read_json(&workspace, uri)).to_owned();
    assert_eq!(kind("agentworkspace:///read?path=..%2Fx"), "outside");
    assert_eq!(
        kind("agentworkspace:///read?path=%2Fetc%2Fpasswd"),
        "outside"
    );
    assert_eq!(kind("agentworkspace:///read?path=out%2Fpasswd"), "outside");
    assert_eq!(kind("agentworkspace:///read?path=missing"), "notexist");
    assert_eq!(kind("agentworkspace:///read?path=.dax"), "invalid");
    assert_eq!(kind("agentworkspace:///read?path=a%2F%2Fb"), "invalid");
    assert_eq!(kind("agentworkspace:///read?path=%FF"), "invalid");
    assert_eq!(kind("agentworkspace:///write?path=x"), "invalid");
    assert_eq!(kind("agentworkspace://host/read?path=x"), "invalid");
    assert_eq!(kind("agentworkspace:///read?path=x#frag"), "invalid");
    assert_eq!(kind("agentworkspace:///read?path=x&path=y"), "invalid");
    assert_eq!(kind("agentworkspace:///read"), "invalid");
    assert_eq!(kind("dax-workspace:///read?path=x"), "invalid");
}

#[test]
fn fifos_are_not_read() {
    let (dir, workspace) = workspace();
    nix::unistd::mkfifo(
        &dir.path().join("pipe"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    let document = read_json(&workspace, "agentworkspace:///read?path=pipe");
    assert_eq!(error_kind(&document), "invalid");
    assert!(
        document["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not a regular file")
    );
}

#[test]
fn times_are_rfc3339_with_trimmed_nanoseconds() {
    assert_eq!(rfc3339_nanos(0, 0), "1970-01-01T00:00:00Z");
    assert_eq!(
        rfc3339_nanos(1_791_547_200, 123_456_789),
        "2026-10-09T12:00:00.123456789Z"
    );
    assert_eq!(
        rfc3339_nanos(1_791_547_200, 100_000_000),
        "2026-10-09T12:00:00.1Z"
    );
    assert_eq!(rfc3339_nanos(951_782_400, 0), "2000-02-29T00:00:00Z");
}
